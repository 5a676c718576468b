"""MindSpore capture, statistics and dump I/O (imports are absolute: ``import mindspore`` inside this
package is the framework, not this package)."""
