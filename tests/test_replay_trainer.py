"""Replay a step of a real HuggingFace ``Trainer`` (tiny GPT-2 from its config, no download, nothing saved
but a tmp dir) through ``dbg.step_fn(trainer)``: bitwise in loss and every statistic both runs recorded,
saying what it covers (the training_step calls: forward and backward, not the Trainer's optimizer step)."""

import warnings

import pytest
import torch

import nbdebug
from nbdebug.replay import ReplayMismatch

pytestmark = pytest.mark.timeout(300)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 100, (16, 8), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def test_trainer_step_replays_bitwise_and_says_what_it_covers(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16))
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, learning_rate=1e-3, report_to=[],
                             save_strategy="no", logging_strategy="no", use_cpu=True, seed=0,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens())
    dbg = nbdebug.Debugger(model, level="L0")
    dbg.step_fn(trainer)
    trainer.train()
    assert dbg.replay_steps == [3]
    kept = dbg._replay.get(3)
    assert len(kept.calls()) == 2  # both accumulated training_step calls of the optimizer step
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReplayMismatch)  # asserted below, with the mismatches shown
        r = dbg.replay(3, level="mix")
    assert r.bitwise and r.compared > 50, [str(m) for m in r.mismatches[:4]]
    assert torch.equal(r.loss, r.live_loss)  # the first training_step's returned loss, bit for bit
    assert any("is not replayed" in n and "optimizer.step" in n and "forward" in n for n in r.notes), r.notes
    assert not any(n.startswith("Optimizer.") for n in r.graph.nodes)  # forward and backward only
    assert any(n.startswith("Functional.") for n in r.graph.nodes), list(r.graph.nodes)[:20]  # op level
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the live model unchanged
    dbg.close()
