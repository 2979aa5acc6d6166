"""The probe calibration (calibration/probe.py): a linear read-out of the answer slot's hidden state
added to temperature + bias, on synthetic reads whose signal sits in the state or in the read."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import log_softmax

from calibration.bias import TemperatureBiasScaler
from calibration.probe import (
    PROBE_MEMBERS,
    ProbeMap,
    ProbeMember,
    ProbeScaler,
    decode_floats,
    encode_floats,
    stored_features,
)


def synthetic(n: int, seed: int, *, signal_in: str, k: int = 2, d: int = 16):
    """n decisions of k options: gold drawn uniformly; the state carries it in its first dimension
    (``signal_in`` "state") or the read does ("read"); the other carries noise."""
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, k, n)
    scales = np.random.default_rng(99).uniform(0.1, 10, d)  # dimensions on very different scales
    state = rng.normal(size=(n, d)) * scales
    z = rng.normal(size=(n, k))
    if signal_in == "state":
        state[:, 0] += 4.0 * scales[0] * (gold - (k - 1) / 2)
    else:
        z[np.arange(n), gold] += 2.0
    return list(log_softmax(z, axis=1)), gold, state


def test_the_probe_learns_an_answer_the_read_does_not_carry():
    logits, gold, state = synthetic(50, 0, signal_in="state")
    probe = ProbeScaler().fit(logits, gold, state)
    held_logits, held_gold, held_state = synthetic(400, 1, signal_in="state")
    accuracy = np.mean(probe.predict_proba(held_logits, held_state).argmax(1) == held_gold)
    bias_only = TemperatureBiasScaler().fit(logits, gold).predict_proba(held_logits)
    assert accuracy > 0.8 and np.mean(bias_only.argmax(1) == held_gold) < 0.6
    assert probe.nll_after_ < probe.nll_before_


def test_where_the_state_is_noise_the_probe_keeps_the_read():
    """W is held small by its penalty, so on a state of noise the answers are temperature + bias's."""
    logits, gold, state = synthetic(50, 2, signal_in="read", k=3)
    probe = ProbeScaler().fit(logits, gold, state)
    held_logits, held_gold, held_state = synthetic(400, 3, signal_in="read", k=3)
    with_probe = probe.predict_proba(held_logits, held_state)
    without = TemperatureBiasScaler().fit(logits, gold).predict_proba(held_logits)
    assert np.mean(with_probe.argmax(1) == without.argmax(1)) > 0.9
    assert np.mean(with_probe.argmax(1) == held_gold) > 0.6


def test_a_stronger_penalty_moves_the_fit_toward_temperature_and_bias():
    logits, gold, state = synthetic(40, 4, signal_in="state")
    norms = [
        np.abs(ProbeScaler(l2, members=1).fit(logits, gold, state).probe_.term(state)).max()
        for l2 in (0.1, 1, 100)
    ]
    assert norms[0] > norms[1] > norms[2] and norms[2] < 0.05
    with pytest.raises(ValueError, match="> 0"):
        ProbeScaler(0.0)


def test_the_stored_map_is_the_fitted_one_and_refuses_another_size():
    logits, gold, state = synthetic(30, 5, signal_in="state", k=3)
    probe = ProbeScaler().fit(logits, gold, state)
    stored = ProbeMap(probe.probe_.encoded)
    assert stored == probe.probe_ and (stored.dimension, stored.options) == (16, 3)
    assert len(stored.members) == PROBE_MEMBERS
    expected = stored.apply(logits, state)
    assert probe.predict_proba(logits, state) == pytest.approx(expected)
    assert probe.bias_.sum() == pytest.approx(0, abs=1e-9)
    assert all(m.bias.sum() == pytest.approx(0, abs=1e-9) for m in stored.members)
    with pytest.raises(ValueError, match="fitted on 16 features, not 15"):
        stored.term(np.zeros(15))
    with pytest.raises(ValueError, match="one row of features per decision"):
        ProbeScaler().fit(logits, gold, state[:-1])


def test_the_members_are_fits_on_resamples_and_their_mean_is_the_answer():
    """members=1 is one fit on every gold answer; the default averages fits on bootstrap resamples,
    drawn from a fixed seed, so the same gold answers give the same stored probe."""
    logits, gold, state = synthetic(40, 7, signal_in="state", k=3)
    one = ProbeScaler(members=1).fit(logits, gold, state)
    (member,) = one.probe_.members
    assert np.allclose(member.mean, state.mean(axis=0), rtol=1e-6) and one.temperature_ == member.temperature
    bagged = ProbeScaler().fit(logits, gold, state)
    assert bagged.probe_ == ProbeScaler().fit(logits, gold, state).probe_
    assert bagged.probe_ != ProbeScaler(seed=1).fit(logits, gold, state).probe_
    members = bagged.probe_.members
    # Each member standardised by its own resample: no two share a mean, none is the full sample's.
    assert len({m.mean.tobytes() for m in members}) == PROBE_MEMBERS
    assert not any(np.allclose(m.mean, member.mean) for m in members)
    z = np.asarray(logits)
    each = [np.exp(log_softmax(m.logits(z, state), axis=1)) for m in members]
    assert bagged.predict_proba(logits, state) == pytest.approx(np.mean(each, axis=0))
    assert bagged.temperature_ == pytest.approx(np.exp(np.mean([np.log(m.temperature) for m in members])))
    with pytest.raises(ValueError, match="members must be"):
        ProbeScaler(members=0)
    with pytest.raises(ValueError, match="same options and dimension"):
        ProbeMap.of([member, ProbeMember(1.0, np.zeros(2), np.zeros(16), np.ones(16), np.zeros((2, 16)))])


def test_averaging_resampled_fits_tempers_a_fit_that_over_reads_few_answers():
    """40 answers, a 200-number state mixing 20 factors, one of which carries the answer: one fit is
    surer than it is right on unseen decisions; the mean of fits on resamples is much less so."""
    mixing = np.random.default_rng(8).normal(size=(20, 200))
    gaps = {}
    for members in (1, PROBE_MEMBERS):
        gap = []
        for seed in range(5):
            rng = np.random.default_rng(100 + seed)
            gold = rng.integers(0, 2, 440)
            factors = rng.normal(size=(440, 20))
            factors[:, 0] += 2 * gold - 1
            state = factors @ mixing + 0.3 * rng.normal(size=(440, 200))
            logits = list(log_softmax(rng.normal(size=(440, 2)) * 0.1, axis=1))
            probe = ProbeScaler(members=members).fit(logits[:40], gold[:40], state[:40])
            p = probe.predict_proba(logits[40:], state[40:])
            gap.append(p.max(axis=1).mean() - np.mean(p.argmax(axis=1) == gold[40:]))
        gaps[members] = float(np.mean(gap))  # mean confidence − accuracy: > 0 is overconfident
    assert gaps[1] > 0.04 and gaps[PROBE_MEMBERS] < 0.6 * gaps[1], gaps


def test_hidden_states_round_trip_as_float32_text():
    values = np.random.default_rng(6).normal(size=576)
    text = encode_floats(values)
    assert len(text) == 3072 and np.array_equal(decode_floats(text), values.astype(np.float32))
    assert (
        stored_features(text) == tuple(values.astype(np.float32).tolist()) and stored_features(None) is None
    )
