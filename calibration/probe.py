"""A calibration that reads the model's own state at the answer slot (mode ``probe``), fitted on gold answers.

Temperature and per-option biases rescale the label log-probs z; where the read carries no signal (on
irony, SmolLM2-135M's P(yes) has an AUROC of 0.51 and the read answers "no" nearly everywhere) no map of
z can learn the answer. The label logits are a linear image of the final hidden state h at the answer
slot (the unembedding's rows for the labels), and h carries far more than those two or six rows read
out of it. The probe adds a linear term on h to ``temperature_bias``'s map:

    p ∝ exp(z / T + b + W x),   x = (h − mean) / scale,

with mean and scale h's per-dimension mean and standard deviation over the fit's gold answers, and one
row of W per option. ``fit`` minimises mean NLL + ``BIAS_L2`` · Σ b² + (λ/2) · ‖W‖² with L-BFGS and the
exact gradient, λ = ``PROBE_L2``: a penalty per decision, as ``temperature_bias``'s, so W stays small
where few gold answers agree and the map is ``temperature_bias``'s where h adds nothing (W = 0). A
linear probe on a frozen model's hidden state is the classic few-shot read-out; pulling it toward the
model's own read (z / T + b) keeps what the read knows where it knows something.

Only an engine that returns the hidden state (``readers.engines.base.Capabilities.features``: the local
engine) can be fitted or served with a probe; the state belongs to one model, revision and precision,
as every fit's key does.
"""

from __future__ import annotations

import base64
import functools
import json
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import log_softmax, softmax

from calibration.bias import BIAS_L2, _one_count
from calibration.temperature import T_MAX, T_MIN, nll_at

PROBE_L2 = 1.0
"""λ, the L2 weight on W on the scale of the mean NLL (standardised features). Fixed before the
development run from a one-off look at 50-gold fits (evidence/few-shot/round-3/rule.md)."""
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


@dataclass(frozen=True)
class ProbeMap:
    """The stored linear term, as text (``encoded``: JSON of the dimension, the option count and the
    mean, scale and weights as :func:`encode_floats`): a fit is compared, stored and cached as this one
    string; the arrays are decoded once, on first use."""

    encoded: str

    @classmethod
    def of(cls, mean, scale, weights) -> ProbeMap:
        w = np.asarray(weights, dtype=float)
        return cls(json.dumps({
            "dimension": int(w.shape[1]), "options": int(w.shape[0]),
            "mean": encode_floats(mean), "scale": encode_floats(scale), "weights": encode_floats(w.ravel()),
        }))  # fmt: skip

    @functools.cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        value = json.loads(self.encoded)
        d, k = value["dimension"], value["options"]
        mean, scale = decode_floats(value["mean"]), decode_floats(value["scale"])
        weights = decode_floats(value["weights"]).reshape(k, d)
        return mean.astype(float), scale.astype(float), weights.astype(float)

    @property
    def dimension(self) -> int:
        return self._arrays[0].shape[0]

    @property
    def options(self) -> int:
        return self._arrays[2].shape[0]

    def term(self, features) -> np.ndarray:
        """W x for one row of features (d,) or many (n, d); ValueError on a dimension it was not fitted on."""
        mean, scale, weights = self._arrays
        h = np.asarray(features, dtype=float)
        if h.shape[-1] != self.dimension:
            raise ValueError(f"the probe was fitted on {self.dimension} features, not {h.shape[-1]}")
        return ((h - mean) / scale) @ weights.T


def apply_probe(logits, features, temperature: float, bias, probe: ProbeMap) -> np.ndarray:
    """softmax(z / T + b + W x), row by row."""
    z = np.asarray(logits, dtype=float)
    u = z / temperature + np.asarray(bias, dtype=float) + probe.term(features)
    return np.exp(log_softmax(u, axis=-1))


class ProbeScaler:
    """Fit T, per-option biases and the probe's W on (n, k) label logits and (n, d) hidden states.

    Attributes set by ``fit``: ``temperature_``, ``bias_`` (k,), ``probe_`` (``ProbeMap``),
    ``n_samples_``, ``nll_before_`` (T = 1, b = 0, W = 0) and ``nll_after_`` (unpenalised NLL at the
    fit) on the fit set.
    """

    def __init__(self, l2: float = PROBE_L2, bias_l2: float = BIAS_L2) -> None:
        if l2 <= 0:
            raise ValueError("l2 must be > 0: it is what holds W on a few gold answers")
        self.l2, self.bias_l2 = l2, bias_l2

    def fit(self, logits, gold, features) -> ProbeScaler:
        z, y = _one_count(logits, gold)
        h = np.asarray(features, dtype=float)
        if h.ndim != 2 or len(h) != len(y):
            raise ValueError("need one row of features per decision")
        if not np.all(np.isfinite(h)):
            raise ValueError("features must be finite")
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
        self.temperature_ = math.exp(result.x[0])
        self.bias_ = b
        # Stored in float32: the fit's own predictions below use the stored map, as the service will.
        self.probe_ = ProbeMap.of(mean, scale, w)
        self.n_samples_ = n
        self.nll_before_ = nll_at(z, y, 1.0)
        self.nll_after_ = float(-np.log(self.predict_proba(z, h)[np.arange(n), y]).mean())
        return self

    def predict_proba(self, logits, features) -> np.ndarray:
        return apply_probe(logits, features, self.temperature_, self.bias_, self.probe_)
