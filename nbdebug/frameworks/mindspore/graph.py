"""MindSpore GRAPH mode: the kernel-by-kernel dump, read into a framework-neutral session.

MindSpore (CPU, GPU, Ascend O0/O1) writes a kernel dump when ``MINDSPORE_DUMP_CONFIG`` names a JSON
config before the first graph is compiled (MindSpore's dump documentation)::

    {path}/rank_{r}/graphs/ms_output_trace_code_graph_{g}.ir     optimized execution graph (text)
    {path}/rank_{r}/execution_order/ms_execution_order_graph_{g}.csv
    {path}/rank_{r}/{net}/{g}/{iteration}/{Op}.{scope}.{task}.{stream}.{timestamp}.{input|output}.{i}.{format}.{dtype}.npy

This module needs numpy only (no MindSpore import): it writes the config (:func:`arm_kernel_dump`),
parses the ``.ir`` text (:func:`parse_ir`) and the execution order into a :class:`KernelGraph` whose
kernels are named by their full scope name (``Default/network-WithLossCell/_backbone-Net/fc1-Dense/MatMul-op0``),
turns the ``.npy`` files of one graph run into statistics rows, node slots and retained values
(:class:`RunRecorder`), and opens an existing dump as an offline session (:func:`load_kernel_dump`).
The live GRAPH-mode adapter is :mod:`nbdebug.frameworks.mindspore.graph_live`.

This module is the index of the pieces, one concern each: ``kernel_config`` (arming the dump),
``kernel_ir`` (the ``.ir``/``.pb`` text and execution order), ``kernel_graph`` (the kernels of one graph and
their inputs), ``kernel_files`` (one iteration's ``.npy`` files), ``kernel_pairing`` (those files paired
with the kernels), ``kernel_recorder`` (graph runs into a session) and ``kernel_load`` (a dump on disk, offline).

>>> cfg = dump_config("/tmp/dump")
>>> cfg["common_dump_settings"]["iteration"], cfg["e2e_dump_settings"]["enable"]
('all', True)
"""

from __future__ import annotations

from .kernel_config import (
                            ENV,
                            NET_NAME,
                            SAMPLED_CAPTURES,
                            arm_kernel_dump,
                            armed_config,
                            armed_dump_dir,
                            check_every,
                            dump_config,
                            dump_parent,
                            sampled_iterations,
)
from .kernel_files import (
                            array_row,
                            index_files,
                            index_iteration,
                            load_npy,
                            misdump_reason,
                            parse_dump_name,
                            split_names,
                            split_runs,
)
from .kernel_graph import (
                            OPTIMIZER_KERNELS,
                            Kernel,
                            KernelGraph,
                            build_kernel_graph,
                            file_key,
                            load_kernel_graph,
                            section_of,
)
from .kernel_ir import IRGraph, IRNode, IRParam, is_optimizer_state, parse_ir, parse_pb, read_execution_order
from .kernel_load import (
                            KernelDump,
                            find_rank_dirs,
                            graph_dirs,
                            graph_ids,
                            group_runs,
                            iteration_dirs,
                            load_kernel_dump,
                            remove_files,
)
from .kernel_pairing import Pairing, match_kernel_files
from .kernel_recorder import CPU_UNFILLED_OUTPUTS, NpyRef, RowBuffer, RunRecorder

__all__ = [
    "ENV", "NET_NAME", "SAMPLED_CAPTURES", "arm_kernel_dump", "armed_config", "armed_dump_dir", "check_every",
    "dump_config", "dump_parent", "sampled_iterations", "array_row", "index_files", "index_iteration", "load_npy",
    "match_kernel_files", "misdump_reason", "parse_dump_name", "split_names", "split_runs", "OPTIMIZER_KERNELS",
    "Kernel", "KernelGraph", "build_kernel_graph", "file_key", "load_kernel_graph", "section_of", "IRGraph", "IRNode",
    "IRParam", "is_optimizer_state", "parse_ir", "parse_pb", "read_execution_order", "KernelDump", "find_rank_dirs",
    "graph_dirs", "graph_ids", "group_runs", "iteration_dirs", "load_kernel_dump", "remove_files", "NpyRef",
    "RowBuffer", "RunRecorder", "Pairing", "CPU_UNFILLED_OUTPUTS",
]
