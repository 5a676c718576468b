"""``first_nonfinite`` on HuggingFace T5 (built from a tiny config, random weights): the ``-inf`` of ``log(0)``
in its relative-position buckets is absorbed by the integer cast after it, so clean steps have no origin; a
NaN injected in one layer is found there."""

from __future__ import annotations

import pytest
import torch
import transformers
from test_nonfinite_origin import _poison

import nbdebug


def _t5() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2,
                                relative_attention_num_buckets=8, dropout_rate=0.0, decoder_start_token_id=0,
                                pad_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_t5_clean_steps_have_no_origin_and_an_injected_nan_is_found(level):
    model = _t5()
    ids, labels = torch.randint(0, 64, (2, 6)), torch.randint(0, 64, (2, 5))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with nbdebug.Debugger(model, level=level) as dbg:
        for _ in range(2):
            model(input_ids=ids, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
        assert dbg.step_index == 2
        assert dbg.first_nonfinite() is None
        assert dbg.first_nonfinite(step=None) is None
        # the -inf is there: log(0) of the relative-position buckets, absorbed by the integer cast
        node, slot, step = dbg.first_nonfinite(benign=False)
        assert (node, slot, step) == ("Torch.log.0.forward", "output.0", 1)
        assert dbg.stats(node, slot)["neg_inf_count"] > 0

        _poison(model.encoder.block[1].layer[1].DenseReluDense.wo)
        model(input_ids=ids, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
        found = dbg.first_nonfinite()
        assert found is not None and found[2] == 2
        assert dbg.graph.nodes[found[0]].scope.endswith("encoder/block/1/layer/1/DenseReluDense/wo")
        assert dbg.stats(found[0], found[1])["nan_count"] > 0
        assert dbg.first_nonfinite(step=1) is None  # the clean step before stays clean
