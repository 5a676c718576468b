"""Kernels paired with a run's dump files (nbdebug.frameworks.mindspore.kernel_pairing.match_kernel_files): what the
data flow cannot tell apart is refused with the reason; pairs learnt from an earlier run hold while the rest of
their group is paired again. Needs numpy only (a synthetic graph and files)."""

import numpy as np

from nbdebug.frameworks.mindspore.kernel_graph import Kernel, KernelGraph
from nbdebug.frameworks.mindspore.kernel_pairing import match_kernel_files


def _graph():
    kernels = [Kernel(f"Default/net/Add-op{i}", "Add", "Default/net", "forward", f"Add.Default_net_Add-op{i}", [])
               for i in range(2)]
    return KernelGraph(0, "g.ir", kernels, {})


def _files(tmp_path):
    files = {}
    for i, value in enumerate((1.0, 2.0)):
        path = str(tmp_path / f"Add.Default_net_Add-op{i}.0.0.{10 + i}.output.0.DefaultFormat.Float32.npy")
        np.save(path, np.full(3, value, np.float32))
        files[f"Add.Default_net_Add-op{i}"] = {"output.0": path, "__dtype__.output.0": "float32",
                                               "__ts__": str(10 + i)}
    return files


def _fingerprint(path):
    return np.load(path).tobytes()


def test_kernels_the_data_flow_cannot_tell_apart_are_refused_with_the_reason(tmp_path):
    kg, files = _graph(), _files(tmp_path)
    pairing = match_kernel_files(kg, files, _fingerprint)
    assert set(pairing.uncertain) == {"Default/net/Add-op0", "Default/net/Add-op1"}
    assert all(why.startswith("not the value used for certain") for why in pairing.uncertain.values())
    # each gets its own-named file, but neither is learnt as certain
    assert pairing.files["Default/net/Add-op1"] is files["Add.Default_net_Add-op1"]
    assert kg.pairing == {}


def test_a_pair_learnt_earlier_holds_and_the_rest_of_its_group_is_paired_again(tmp_path):
    kg, files = _graph(), _files(tmp_path)
    kg.pairing["Add.Default_net_Add-op1"] = "Default/net/Add-op0"  # learnt from an earlier run (crossed names)
    pairing = match_kernel_files(kg, files, _fingerprint)
    assert pairing.uncertain == {}
    assert pairing.files["Default/net/Add-op0"] is files["Add.Default_net_Add-op1"]
    assert pairing.files["Default/net/Add-op1"] is files["Add.Default_net_Add-op0"]  # the one file left
    assert kg.pairing == {"Add.Default_net_Add-op1": "Default/net/Add-op0",
                          "Add.Default_net_Add-op0": "Default/net/Add-op1"}
