"""A calibration that reads the model's own state at the answer slot (mode ``probe``), fitted on gold answers.

Temperature and per-option biases rescale the label log-probs z; where the read carries no signal (on
irony, SmolLM2-135M's P(yes) has an AUROC of 0.51 and the read answers "no" nearly everywhere) no map of
z can learn the answer. The label logits are a linear image of the final hidden state h at the answer
slot (the unembedding's rows for the labels), and h carries far more than those two or six rows read
out of it. The probe adds a linear term on h to ``temperature_bias``'s map:

    p ∝ exp(z / T + b + W x),   x = (h − mean) / scale,

with mean and scale h's per-dimension mean and standard deviation over the fit's gold answers, and one
row of W per option. A fit minimises mean NLL + ``BIAS_L2`` · Σ b² + (λ/2) · ‖W‖² with L-BFGS and the
exact gradient, λ = ``PROBE_L2``: a penalty per decision, as ``temperature_bias``'s, so W stays small
where few gold answers agree and the map is ``temperature_bias``'s where h adds nothing (W = 0). A
linear probe on a frozen model's hidden state is the classic few-shot read-out; pulling it toward the
model's own read (z / T + b) keeps what the read knows where it knows something.

On a few dozen answers and hundreds of dimensions one such fit over-reads its examples: its answers
are right more often than the read's but surer than they are right. The stored probe is therefore
the mean of ``PROBE_MEMBERS`` fits' probabilities, each fitted (standardisation, T, b and W) on a
bootstrap resample of the gold answers: bagging, which averages away what one resample's accident
taught a fit (docs/calibration.md, rounds 3 and 4: on the test samples' choice questions after 50
gold answers, ECE 0.057 with one fit and 0.035 with ten, temperature's 0.022; accuracy 69.5% and
69.8%). The resamples come from a generator seeded ``PROBE_SEED``, so the same gold answers always
give the same fit.

Only an engine that returns the hidden state (``readers.engines.base.Capabilities.features``: the local
engine) can be fitted or served with a probe; the state belongs to one model, revision and precision,
as every fit's key does.
"""

from __future__ import annotations

import base64
import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import log_softmax, softmax

from calibration.bias import BIAS_L2, _one_count
from calibration.temperature import T_MAX, T_MIN, nll_at

PROBE_L2 = 1.0
"""λ, the L2 weight on W on the scale of the mean NLL (standardised features). Fixed before the
development run from a one-off look at 50-gold fits (evidence/few-shot/round-3/rule.md)."""
PROBE_MEMBERS = 10
"""Fits averaged per probe (evidence/few-shot/round-4/rule.md: 5, 10 and 20 were looked at on dev;
10 had the lowest pooled ECE). 1 is round 3's single fit on all the gold answers."""
PROBE_SEED = 0
MIN_SCALE = 1e-6
"""A feature's scale at least: a dimension constant over the gold answers carries nothing."""


def encode_floats(values) -> str:
    """Numbers as the stores keep a hidden state: base64 of little-endian float32 (3,072 characters for
    576 numbers, where JSON text takes ~11,000)."""
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode("ascii")


def decode_floats(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def stored_features(text: str | None) -> tuple[float, ...] | None:
    """A decision's hidden state as a store row holds it (:func:`encode_floats`, or NULL)."""
    return None if text is None else tuple(decode_floats(text).tolist())


def checked_features(features, dimension: int) -> np.ndarray:
    """Hidden states as float64, one (d,) or many (n, d); ValueError on a dimension the probe was not
    fitted on."""
    h = np.asarray(features, dtype=float)
    if h.shape[-1] != dimension:
        raise ValueError(f"the probe was fitted on {dimension} features, not {h.shape[-1]}")
    return h


@dataclass(frozen=True, eq=False)  # arrays: a probe is compared by its ProbeMap's text
class ProbeMember:
    """One fit: p ∝ exp(z / temperature + bias + W x), x = (h − mean) / scale."""

    temperature: float
    bias: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray

    def term(self, h: np.ndarray) -> np.ndarray:
        """W x for one row of features (d,) or many (n, d)."""
        return ((h - self.mean) / self.scale) @ self.weights.T

    def logits(self, z: np.ndarray, h: np.ndarray) -> np.ndarray:
        return z / self.temperature + self.bias + self.term(h)


@dataclass(frozen=True, eq=False)  # arrays: compared, if ever, by the text it was decoded from
class FoldedProbe:
    """A probe as answers apply it: each member's standardisation folded into its weights
    (W x = (W / scale) h − (W / scale) · mean), the members stacked, no text. What the service keeps in
    memory (``calibration.probe_cache``): ``nbytes`` ≈ members · options · dimension · 4, 46 KB for
    ten two-option members on a 576-number state, where the text and the decoded members took ~0.3 MB."""

    inverse_temperature: np.ndarray  # (members,) float64
    bias: np.ndarray  # (members, options) float64: b − (W / scale) · mean
    weights: np.ndarray  # (members, options, dimension) float32, as the text stores W

    @property
    def dimension(self) -> int:
        return self.weights.shape[2]

    @property
    def options(self) -> int:
        return self.weights.shape[1]

    @property
    def nbytes(self) -> int:
        return self.inverse_temperature.nbytes + self.bias.nbytes + self.weights.nbytes

    def apply(self, logits, features) -> np.ndarray:
        """The mean over members of softmax(z / T + b + W x), row by row."""
        z, h = np.asarray(logits, dtype=float), checked_features(features, self.dimension)
        lead = (len(self.bias),) + (1,) * (z.ndim - 1)
        u = (
            z[None] * self.inverse_temperature.reshape(lead + (1,))
            + self.bias.reshape(lead + (self.options,))
            + np.einsum("...d,mkd->m...k", h, self.weights)
        )
        return softmax(u, axis=-1).mean(axis=0)


@dataclass(frozen=True)
class ProbeMap:
    """The stored probe, as text (``encoded``: JSON of the dimension, the option count and each
    member's temperature, bias, and mean, scale and weights as :func:`encode_floats`): a fit is
    compared and stored as this one string. ``members`` decodes it as fitted; ``folded`` as applied."""

    encoded: str

    @classmethod
    def of(cls, members: Sequence[ProbeMember]) -> ProbeMap:
        if not members:
            raise ValueError("a probe has at least one member")
        k, d = np.shape(members[0].weights)
        if any(np.shape(m.weights) != (k, d) for m in members):
            raise ValueError("every member reads the same options and dimension")
        return cls(json.dumps({"dimension": int(d), "options": int(k), "members": [
            {"temperature": float(m.temperature), "bias": [float(v) for v in m.bias],
             "mean": encode_floats(m.mean), "scale": encode_floats(m.scale),
             "weights": encode_floats(np.ravel(m.weights))}
            for m in members
        ]}))  # fmt: skip

    @functools.cached_property
    def members(self) -> tuple[ProbeMember, ...]:
        value = json.loads(self.encoded)
        d, k = value["dimension"], value["options"]
        return tuple(
            ProbeMember(
                temperature=float(m["temperature"]), bias=np.asarray(m["bias"], dtype=float),
                mean=decode_floats(m["mean"]).astype(float), scale=decode_floats(m["scale"]).astype(float),
                weights=decode_floats(m["weights"]).reshape(k, d).astype(float),
            )
            for m in value["members"]
        )  # fmt: skip

    @functools.cached_property
    def folded(self) -> FoldedProbe:
        scaled = [m.weights / m.scale for m in self.members]
        return FoldedProbe(
            inverse_temperature=np.array([1 / m.temperature for m in self.members]),
            bias=np.stack([m.bias - w @ m.mean for m, w in zip(self.members, scaled)]),
            weights=np.stack(scaled).astype(np.float32),
        )

    @functools.cached_property
    def _shape(self) -> tuple[int, int, int]:
        """(dimension, options, members), from the text without decoding the weights: what a store's
        lookup cache keeps of each probe it reads."""
        value = json.loads(self.encoded)
        return value["dimension"], value["options"], len(value["members"])

    @property
    def dimension(self) -> int:
        return self._shape[0]

    @property
    def options(self) -> int:
        return self._shape[1]

    @property
    def member_count(self) -> int:
        return self._shape[2]

    def term(self, features) -> np.ndarray:
        """Each member's W x for one row of features (d,) or many (n, d): shape (members, ..., k);
        ValueError on a dimension it was not fitted on."""
        h = checked_features(features, self.dimension)
        return np.stack([m.term(h) for m in self.members])

    def apply(self, logits, features) -> np.ndarray:
        """The mean over members of softmax(z / T + b + W x), row by row (:meth:`FoldedProbe.apply`)."""
        return self.folded.apply(logits, features)


class ProbeScaler:
    """Fit a probe on (n, k) label logits, (n,) gold indices and (n, d) hidden states: ``members``
    fits, each on a bootstrap resample drawn with ``seed`` (``members=1``: one fit on all of them).

    Attributes set by ``fit``: ``probe_`` (``ProbeMap``), ``temperature_`` and ``bias_`` (the
    members' geometric-mean T and mean b: what a listing shows; the answers average the members'
    probabilities), ``n_samples_``, ``nll_before_`` (T = 1, b = 0, W = 0) and ``nll_after_``
    (unpenalised NLL of the stored probe) on the fit set.
    """

    def __init__(
        self,
        l2: float = PROBE_L2,
        bias_l2: float = BIAS_L2,
        *,
        members: int = PROBE_MEMBERS,
        seed: int = PROBE_SEED,
    ) -> None:
        if l2 <= 0:
            raise ValueError("l2 must be > 0: it is what holds W on a few gold answers")
        if members < 1:
            raise ValueError("members must be ≥ 1")
        self.l2, self.bias_l2, self.members, self.seed = l2, bias_l2, members, seed

    def fit(self, logits, gold, features) -> ProbeScaler:
        z, y = _one_count(logits, gold)
        h = np.asarray(features, dtype=float)
        if h.ndim != 2 or len(h) != len(y):
            raise ValueError("need one row of features per decision")
        if not np.all(np.isfinite(h)):
            raise ValueError("features must be finite")
        n = len(y)
        if self.members == 1:
            samples = [np.arange(n)]
        else:
            rng = np.random.default_rng(self.seed)
            samples = [rng.integers(0, n, n) for _ in range(self.members)]
        # Stored in float32: the fit's own predictions below use the stored map, as the service will.
        self.probe_ = ProbeMap.of([self._fit_one(z[s], y[s], h[s]) for s in samples])
        members = self.probe_.members
        self.temperature_ = math.exp(float(np.mean([math.log(m.temperature) for m in members])))
        self.bias_ = np.mean([m.bias for m in members], axis=0)
        self.n_samples_ = n
        self.nll_before_ = nll_at(z, y, 1.0)
        self.nll_after_ = float(-np.log(self.predict_proba(z, h)[np.arange(n), y]).mean())
        return self

    def _fit_one(self, z: np.ndarray, y: np.ndarray, h: np.ndarray) -> ProbeMember:
        n, k = z.shape
        mean, scale = h.mean(axis=0), np.maximum(h.std(axis=0), MIN_SCALE)
        x = (h - mean) / scale
        d = x.shape[1]
        onehot = np.eye(k)[y]

        def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
            log_t, b, w = theta[0], theta[1 : k + 1], theta[k + 1 :].reshape(k, d)
            t = math.exp(log_t)
            u = z / t + b + x @ w.T
            logp = log_softmax(u, axis=1)
            value = (
                -logp[np.arange(n), y].mean()
                + self.bias_l2 * float(b @ b)
                + self.l2 / 2 * float((w * w).sum())
            )
            residual = (softmax(u, axis=1) - onehot) / n  # d mean NLL / d u
            grad_log_t = float((residual * (-z / t)).sum())
            grad_b = residual.sum(axis=0) + 2 * self.bias_l2 * b
            grad_w = residual.T @ x + self.l2 * w
            return value, np.concatenate([[grad_log_t], grad_b, grad_w.ravel()])

        bounds = [(math.log(T_MIN), math.log(T_MAX))] + [(None, None)] * (k + k * d)
        result = minimize(loss, np.zeros(1 + k + k * d), jac=True, method="L-BFGS-B", bounds=bounds)
        if not np.all(np.isfinite(result.x)):
            raise RuntimeError(f"probe fit failed: {result.message}")
        b = result.x[1 : k + 1]
        w = result.x[k + 1 :].reshape(k, d)
        # Adding one vector to every row of W, or one constant to every b, changes no probability:
        # centre both so the stored fit is the one with the smallest norm.
        w, b = w - w.mean(axis=0), b - b.mean()
        return ProbeMember(math.exp(result.x[0]), b, mean, scale, w)

    def predict_proba(self, logits, features) -> np.ndarray:
        return self.probe_.apply(logits, features)
