"""PyTorch capture, statistics and dump I/O (imports are absolute: ``import torch`` inside this
package is the framework, not this package)."""
