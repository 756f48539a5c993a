"""The drift audit's token alignment: one difference is counted once, not as every later token."""

from __future__ import annotations

from components.tito import ChatMessage, drift_audit
from components.tito.drift_audit import count_mismatched


def test_an_early_difference_is_not_counted_for_every_later_token():
    truth = [1, 10, 11, 12, 2, 1, 20, 21, 2, 1, 30, 31, 2]
    other = [1, 10, 99, 12, 2, 1, 20, 21, 2, 1, 30, 31, 2]
    assert count_mismatched(truth, other, frozenset({1, 2})) == 1
    split = [1, 10, 11, 12, 2, 1, 20, 77, 78, 2, 1, 30, 31, 2]  # one token written as two
    assert count_mismatched(truth, split, frozenset({1, 2})) == 2
    assert count_mismatched(truth, truth + [198], frozenset({1, 2})) == 0  # re-render's trailing newline
    assert count_mismatched(truth, [], frozenset()) == len(truth)


def test_a_faithful_segment_has_no_drift_and_a_changed_one_does(tokenizer):
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="What is 2+2?"),
        ChatMessage(role="assistant", content="4"),
    ]
    ids = tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages], tokenize=False
    )
    ids = tokenizer.encode(ids, add_special_tokens=False)[:-1]  # a segment ends at the sampled <|im_end|>
    report = drift_audit(tokenizer, ids, messages)
    assert (report.num_tokens, report.num_mismatched, report.first_mismatch_index) == (len(ids), 0, None)
    changed = list(ids)
    changed[-2] = tokenizer.encode("5", add_special_tokens=False)[0]
    report = drift_audit(tokenizer, changed, messages)
    assert report.num_mismatched == 1 and report.first_mismatch_index == len(ids) - 2
    assert 0 < report.mismatch_rate < 0.1
