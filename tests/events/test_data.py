"""Event sequences: checks naming the sequence, readers, splits, batches and their round trip through fit's form."""

import json
import math

import numpy as np
import pytest
import torch

from flowkit.events import EventBatch, EventSequences, read_csv, read_jsonl


def _seqs():
    return EventSequences(
        [
            {"times": [0.5, 1.2, 2.0], "marks": [0, 1, 0], "t_end": 3.0, "name": "a"},
            {"times": [0.1, 0.4], "marks": [1, 1], "name": "b"},
        ]
    )


@pytest.mark.parametrize(
    "sequence, message",
    [
        ({"times": [1.0, 0.5], "name": "dec"}, "'dec'.*decreasing"),
        ({"times": [1.0, 1.0], "name": "tie"}, "'tie'.*tie"),
        ({"times": [1.0, math.nan], "name": "nan"}, "'nan'.*finite"),
        ({"times": [1.0, 2.0], "marks": [0, 3], "name": "mk"}, "'mk'.*outside the declared range"),
        ({"times": [1.0, 2.0], "marks": [0, -1], "name": "neg"}, "'neg'.*outside"),
        ({"times": [], "name": "empty"}, "'empty' is empty"),
        ({"times": [1.0, 2.0], "t_end": 1.5, "name": "end"}, "'end'.*before the last event"),
        ({"times": [0.0, 2.0], "name": "start"}, "'start'.*not after the window start"),
    ],
)
def test_bad_input_names_the_sequence(sequence, message):
    with pytest.raises(ValueError, match=message):
        EventSequences([{"times": [0.3]}, sequence], num_marks=2)


def test_batch_padding_masks_and_survival():
    batch = _seqs().batch()
    assert batch.tau.shape == (2, 3)
    assert torch.allclose(batch.tau[0], torch.tensor([0.5, 0.7, 0.8], dtype=torch.float64))
    assert batch.mask.tolist() == [[True, True, True], [True, True, False]]
    assert batch.tau[1, 2] == 1.0 and batch.marks[1, 2] == 0
    assert torch.allclose(batch.survival, torch.tensor([1.0, 0.0], dtype=torch.float64))


def test_fit_form_round_trip_trims_padding():
    seqs = _seqs()
    x, context = seqs.as_fit_data()
    back = EventBatch.from_tensors(x[1:], context[1:])  # the short sequence alone: trimmed to its 2 events
    assert back.tau.shape == (1, 2) and back.marks.tolist() == [[1, 1]]
    with pytest.raises(ValueError, match=r"\(B, L, 3\)"):
        EventBatch.from_tensors(x[..., :2], context)


def test_split_by_sequence_is_a_partition():
    seqs = EventSequences([{"times": [i + 1.0], "name": i} for i in range(10)])
    parts = seqs.split((0.6, 0.2, 0.2), seed=3)
    names = [s.name for p in parts for s in p]
    assert sorted(names, key=int) == [str(i) for i in range(10)]
    assert [len(p) for p in parts] == [6, 2, 2]
    with pytest.raises(ValueError, match="sum to 1"):
        seqs.split((0.5, 0.2))


def test_log_inter_time_standardisation():
    seqs = _seqs()
    mean, std = seqs.log_inter_time_stats()
    logs = np.log([0.5, 0.7, 0.8, 0.1, 0.3])
    assert mean == pytest.approx(logs.mean()) and std == pytest.approx(logs.std())


def test_csv_reader(tmp_path):
    path = tmp_path / "events.csv"
    path.write_text("seq_id,time,mark\nx,0.5,1\ny,0.2,0\nx,1.5,2\n")
    seqs = read_csv(path, window_end=4.0)
    assert len(seqs) == 2 and seqs.num_marks == 3 and seqs[0].name == "x"
    assert seqs[0].times.tolist() == [0.5, 1.5] and seqs[0].t_end == 4.0
    path.write_text("seq_id,time,mark\nx,1.5,0\nx,0.5,0\n")
    with pytest.raises(ValueError, match="'x'.*decreasing"):
        read_csv(path)
    path.write_text("seq_id,time,mark\nx,abc,0\n")
    with pytest.raises(ValueError, match="line 2"):
        read_csv(path)


def test_jsonl_readers_easytpp_and_ifltpp(tmp_path):
    easy = tmp_path / "easy.jsonl"
    rows = [
        {"dim_process": 3, "seq_idx": 0, "time_since_start": [0.3, 1.0], "type_event": [2, 0]},
        {"dim_process": 3, "seq_idx": 1, "time_since_start": [0.1], "type_event": [1]},
    ]
    easy.write_text("\n".join(json.dumps(r) for r in rows))
    seqs = read_jsonl(easy)
    assert seqs.num_marks == 3 and seqs.num_events == 3 and seqs[0].marks.tolist() == [2, 0]
    ifl = tmp_path / "ifl.jsonl"
    _seqs().to_jsonl(ifl)
    back = read_jsonl(ifl)
    assert back.num_marks == 2 and back[0].t_end == 3.0 and back[1].times.tolist() == [0.1, 0.4]
    # EasyTPP's own files start each sequence with an event at 0: the window opens there
    easy.write_text(json.dumps({"time_since_start": [0.0, 0.4, 1.0], "type_event": [1, 0, 1], "dim_process": 2}))
    (seq,) = read_jsonl(easy)
    assert seq.times.tolist() == [0.4, 1.0] and seq.marks.tolist() == [0, 1] and seq.t_start == 0.0
    easy.write_text(json.dumps({"time_since_start": [0.5, 0.2], "type_event": [0, 0], "seq_idx": 7}))
    with pytest.raises(ValueError, match="'7'.*decreasing"):
        read_jsonl(easy)
