"""What the processes of a run must share (agreement.py): the first difference named with its
values and ranks; options of a machine's own left out; the facts of data and weights that tell two
runs apart (two torchrun nodes that disagree: tests/train/test_run.py)."""

import torch
from conftest import synthetic_data_dir

from nmt_cli.config import TrainConfig
from nmt_cli.corpus.datadir import DataDir
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.train.agreement import data_facts, disagreement, option_facts, start_facts


def test_the_first_difference_is_named_with_its_values_and_ranks():
    same = {"--lr-scale": "1.0", "--dropout": "0.1"}
    assert disagreement([same, dict(same), dict(same)]) is None
    line = disagreement([same, {**same, "--dropout": "0.3", "--lr-scale": "5.0"}, same, {**same, "--lr-scale": "5.0"}])
    assert line == ("the processes disagree on --lr-scale: 1.0 on ranks 0, 2; 5.0 on ranks 1, 3; start every process "
                    "with the same options, data and checkpoint")
    assert disagreement([same, {"--lr-scale": "1.0"}]).startswith("the processes disagree on --dropout: 0.1 on rank 0; "
                                                                  "nothing on rank 1;")


def test_the_options_of_a_machine_are_its_own():
    model = ModelConfig(d_model=16, d_ff=32, heads=2, encoder_layers=1, decoder_layers=1)
    ours = option_facts(model, TrainConfig(), reset=False, init_from=None)
    assert option_facts(model, TrainConfig(device="cpu", threads=3, precision="bf16"), False, None) == ours
    assert option_facts(model, TrainConfig(lr_scale=5.0), False, None)["--lr-scale"] == "5.0" != ours["--lr-scale"]
    assert ours["--d-model"] == "16" and ours["--reset"] == "False" and ours["--init-from"] == "not given"


def test_data_of_the_same_size_and_weights_of_another_seed_tell_apart(tmp_path):
    one, other = (DataDir.open(synthetic_data_dir(tmp_path / name, seed=seed)) for name, seed in (("a", 0), ("b", 1)))
    facts = data_facts(one), data_facts(other)
    assert facts[0]["the data directory's pairs"] == facts[1]["the data directory's pairs"] == "train 400, valid 40"
    assert len({f["the data directory's files (sha256 of their sha256s)"] for f in facts}) == 2
    models = [torch.nn.Linear(3, 2) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    assert start_facts(models[0], 5) == start_facts(models[1], 5) != start_facts(models[1], 6)
    with torch.no_grad():
        models[1].bias[0] += 1e-6
    assert start_facts(models[0], 5) != start_facts(models[1], 5)
