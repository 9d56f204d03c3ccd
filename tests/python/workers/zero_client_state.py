"""A torch optimizer the ZeRO engine runs as given (RMSprop, by name in the config) keeps
its state across save_checkpoint and load_checkpoint: the resumed run's losses equal the
uninterrupted run's; a load at another ZeRO stage is refused by name (that state does not
reshard) on every rank.

    zero_client_state.py CHECKPOINT_DIR
"""
import sys

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd


def make(stage, optimizer=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    engine, _, _, _ = deepspeed.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
        "optimizer": optimizer or {"type": "RMSprop", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": stage}})
    return engine


def steps(engine, batches):
    losses = []
    for x in batches:
        loss = engine(x).square().mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def resumes(folder, optimizer=None):
    """Checkpointed at step 3 and resumed: the same losses; refused at another stage."""
    gen = torch.Generator().manual_seed(hvd.rank())
    data = [torch.randn(4, 8, generator=gen) for _ in range(6)]
    first = make(2, optimizer)
    steps(first, data[:3])
    first.save_checkpoint(folder)
    want = steps(first, data[3:])
    resumed = make(2, optimizer)
    resumed.load_checkpoint(folder)
    got = steps(resumed, data[3:])
    assert max(abs(a - b) for a, b in zip(want, got)) < 1e-7, (want, got)
    try:
        make(1, optimizer).load_checkpoint(folder)
        raise AssertionError("a torch optimizer's state loaded at another ZeRO stage")
    except ValueError as e:
        assert "does not reshard" in str(e), e


if __name__ == "__main__":
    hvd.init()
    resumes(sys.argv[1])
    print(f"client state ok {hvd.rank()}", flush=True)
