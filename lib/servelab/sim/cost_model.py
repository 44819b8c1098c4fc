"""How long one engine step takes, predicted from its batch composition: the simulator's stand-in for the GPU.

    step_ms = prefill_scale · PREFILL(batch) + decode_scale · DECODE(batch) + ms_per_context_pair · Σ n_i c_i
              + mixed_step_ms · [prefill and decodes] + step_overhead_ms + seq_overhead_ms · num_seqs

    PREFILL(batch) = prefill_fixed_scale · a_p + b_p · (N_p + pad) + k_p · Σ n_i(c_i + n_i/2)
                     + ms_per_longest_context_token · max(c_i, c_j)                             (0 if decode-only)
    DECODE(batch)  = [a_d + ms_per_decode_walk_token · max c_j if decode-only] + b_d · B + k_d · Σ c_j

``N_p`` prefill tokens in chunks of ``n_i`` new tokens after ``c_i`` cached ones; ``B`` decodes with ``c_j`` cached
tokens each; ``pad`` the padding tokens of a server that replays captured step graphs at fixed token counts
(``step_buckets``): a step of 2,080 tokens runs the 3,072-token graph and pays its dense layers. The GPU coefficients
are Study 2's fitted ``servelab.sim.cost_fit.CostModel`` (same JSON): its per-phase fits (``gpu_form="phase"``, the
default), or its one model of any step when the JSON has one (``gpu_form="step"``: an intercept, a fixed cost of a
step with chunks, and pairs with cached context priced apart from those within a chunk; see ``gpu_terms``); a mixed
step pays the prefill intercept once and the decode terms per decode. (On Study 1's H200 runs with whole-step graphs,
the per-phase form with the serving terms below validated better than the step model; the step model is there to be
compared as both are re-measured.) The scales (1 unless calibrated) say how much slower or faster the server's
prefill and decode run than the mode Study 2 measured (an HF CUDA-graph fit standing in for the engine, or a server
path Study 2 did not time), and ``ms_per_context_pair`` prices the prefill chunks' attention to *cached* context
(``n_i`` new tokens after ``c_i`` cached) beyond what Study 2's per-phase fit charges for any pair.
``prefill_fixed_scale`` lets a step's fixed prefill cost differ from Study 2's intercept independently of its
per-token terms (a server path with or without CUDA graphs moves the first, not the second), and ``mixed_step_ms`` is
what a step holding both prefill chunks and decodes costs beyond its two parts. ``ms_per_longest_context_token``
prices the longest context one sequence of a step with prefill reads, a chunk's or a decode's: the engine runs such a
step through one ragged attention kernel whose programs each walk one sequence's cached keys in order, too few of
them to fill the GPU, so the step waits for the longest walk, not for the query–key pairs (a chunk of a few hundred
tokens after a long context, a prompt whose system prompt hit the prefix cache, or a decode with thousands of tokens
of context beside a fresh chunk). Study 2's chunk-after-context steps on the H200 price it at about 0.9 µs per cached
token on the 0.5B (``servelab.studies.s08_simulator.context_reads``); Study 1's mixed steps pay the same rate for
their longest decode's context. A decode-only step runs the decode kernel instead, also one program per sequence and
KV head walking its keys in order, at its own rate: ``ms_per_decode_walk_token`` prices the step's longest sequence
(Study 2's decode steps on the H200: one sequence of 16,384 tokens costs nearly as much as 64 of them, which a price
per token of total context alone misses; ``servelab.studies.s08_simulator.context_reads`` refits the decode terms
with it). The two overhead terms are what the GPU model leaves out and the real server pays every step (Python
scheduling, sampling, handing tokens to the HTTP layer); ``ingress_ms`` is the path from a request's send to the
engine's queue (HTTP parsing, tokenisation, the engine thread picking it up): the simulator delays each arrival by
it. All these terms are fitted from the real server's step log and request records (``servelab.sim.calibration``)."""

from __future__ import annotations

import json
from bisect import bisect_left
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from servelab.errors import ParameterError
from servelab.sim.cost_fit import DECODE_TERMS, PREFILL_TERMS, CostModel

OVERHEAD_TERMS = (
    "prefill_scale",
    "decode_scale",
    "ms_per_context_pair",
    "step_overhead_ms",
    "seq_overhead_ms",
    "ingress_ms",
    "prefill_fixed_scale",
    "mixed_step_ms",
    "ms_per_longest_context_token",
    "ms_per_decode_walk_token",
)
SCALES = ("prefill_scale", "decode_scale", "prefill_fixed_scale")
GPU_FORMS = ("phase", "step")


@dataclass(frozen=True)
class StepCostModel:
    """Step duration (ms) from batch composition: Study 2's GPU terms plus measured serving overheads."""

    gpu: CostModel
    prefill_scale: float = 1.0  # multiplies Study 2's prefill terms (dimensionless)
    decode_scale: float = 1.0  # multiplies Study 2's decode terms (dimensionless)
    ms_per_context_pair: float = 0.0  # prefill attention to cached context, per (new token, cached token) pair (ms)
    step_overhead_ms: float = 0.0  # per step, whatever its size (ms)
    seq_overhead_ms: float = 0.0  # per sequence in the batch (ms)
    ingress_ms: float = 0.0  # request sent → in the engine's queue (ms)
    prefill_fixed_scale: float = 1.0  # multiplies Study 2's prefill intercept on top of prefill_scale (dimensionless)
    mixed_step_ms: float = 0.0  # extra fixed cost of a step with prefill chunks and decodes (ms)
    ms_per_longest_context_token: float = 0.0  # per cached token of the longest context a step with prefill reads (ms)
    ms_per_decode_walk_token: float = 0.0  # per cached token of a decode-only step's longest sequence (ms)
    gpu_form: str = "phase"  # Study 2's per-phase fits ("phase") or its one model of any step ("step")
    step_buckets: tuple = ()  # token counts of the server's captured steps (``with_step_buckets``); () none
    source: str = ""  # where the coefficients came from (for captions and sidecars)
    _c: tuple = field(init=False, repr=False, compare=False)
    _cc: float = field(init=False, repr=False, compare=False)
    _cw: float = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        for k in OVERHEAD_TERMS:
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise ParameterError(f"{k} must be a finite number >= 0, got {v!r}")
        b = self.step_buckets
        if (
            not isinstance(b, tuple)
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in b)
            or list(b) != sorted(set(b))
        ):
            raise ParameterError(f"step_buckets must be a tuple of increasing positive integers, got {b!r}")
        if self.gpu_form not in GPU_FORMS:
            raise ParameterError(f"gpu_form must be one of {GPU_FORMS}, got {self.gpu_form!r}")
        if self.gpu_form == "step" and not getattr(self.gpu, "step", None):
            raise ParameterError(
                f"gpu_form='step' needs Study 2's step model, which {self.gpu.model}/{self.gpu.mode} "
                f"lacks (a JSON without 'step', or too few rows to fit one)"
            )
        coef = list(self.gpu_terms())
        # plain floats: the simulator calls step_ms once per step, numpy per call would dominate the loop
        if any(not np.isfinite(c) for c in coef) or any(c < 0 for i, c in enumerate(coef) if i != 3):
            raise ParameterError(f"cost-model coefficients must be finite and >= 0, got {coef}")
        sp, sd = self.prefill_scale, self.decode_scale
        coef[0] *= self.prefill_fixed_scale
        object.__setattr__(self, "_c", tuple([c * sp for c in coef[:4]] + [c * sd for c in coef[4:]]))
        object.__setattr__(self, "_cc", self.ms_per_longest_context_token * sp)  # a prefill term: scaled alike
        object.__setattr__(self, "_cw", self.ms_per_decode_walk_token * sd)  # a decode term: scaled alike

    def gpu_terms(self) -> tuple[float, ...]:
        """Study 2's GPU terms, unscaled, in the form both its fits map to:
        ``(a_p, b_p, k_p, k_cx, a_d, b_d, k_d)``: a step with prefill chunks costs ``a_p + b_p·N + k_p·Σ n(c + n/2)
        + k_cx·Σ n·c``, a decode-only step ``a_d``, and decodes ``b_d·B + k_d·C`` in either (ms). The per-phase
        fits price every query–key pair alike (``k_cx = 0``); the step model prices pairs with cached context on
        their own (``k_cx`` = its context-pair cost minus its new-pair cost, which may be negative)."""
        if self.gpu_form == "step":  # Study 2's one model of prefill, decode, chunk-after-context and mixed steps
            st = {k: float(v) for k, v in self.gpu.step.items()}
            a, k_n = st["intercept_ms"], st["ms_per_new_pair"]
            return (
                a + st["ms_per_prefill_step"],
                st["ms_per_prefill_token"],
                k_n,
                st["ms_per_context_pair"] - k_n,
                a,
                st["ms_per_decode"],
                st["ms_per_decode_ctx_token"],
            )
        a_p, b_p, k_p = (float(self.gpu.prefill[k]) for k in PREFILL_TERMS)
        a_d, b_d, k_d = (float(self.gpu.decode[k]) for k in DECODE_TERMS)
        return a_p, b_p, k_p, 0.0, a_d, b_d, k_d

    # ---- prediction --------------------------------------------------------------------------------
    def gpu_ms(
        self,
        prefill_tokens: int,
        prefill_pairs: float,
        num_decodes: int,
        decode_context: int,
        context_pairs: float = 0.0,
        longest_context: int = 0,
    ) -> float:
        """GPU time (ms) of a step: ``prefill_tokens`` with ``prefill_pairs`` causal query–key pairs in total
        (``context_pairs`` of them between new tokens and cached ones; ``longest_context`` the most cached tokens
        any one sequence of the step reads, chunk or decode), ``num_decodes`` decodes over ``decode_context``
        cached tokens in total. ``longest_context`` is priced at the ragged kernel's rate in a step with prefill
        and at the decode kernel's in a decode-only one."""
        a_p, b_p, k_p, k_cx, a_d, b_d, k_d = self._c
        t = b_d * num_decodes + k_d * decode_context
        if prefill_tokens:
            pad = self.pad_tokens(prefill_tokens + num_decodes) if self.step_buckets else 0
            t = (
                t
                + a_p
                + b_p * (prefill_tokens + pad)
                + k_p * prefill_pairs
                + (self.ms_per_context_pair + k_cx) * context_pairs
                + self._cc * longest_context
            )
            return t + self.mixed_step_ms if num_decodes else t
        return t + a_d + self._cw * longest_context

    def pad_tokens(self, step_tokens: int) -> int:
        """Padding a step of ``step_tokens`` tokens (prefill and decodes) carries: the engine replays the graph
        of the smallest captured bucket that holds it (``servelab.engine.step_graphs``), and every padding token
        goes through the dense layers like a real one. 0 without buckets, or above the largest (run eagerly)."""
        b = self.step_buckets
        if not b:
            return 0
        i = bisect_left(b, step_tokens)
        return b[i] - step_tokens if i < len(b) else 0

    def step_ms(
        self,
        prefill_tokens: int,
        prefill_pairs: float,
        num_decodes: int,
        decode_context: int,
        num_seqs: int,
        context_pairs: float = 0.0,
        longest_context: int = 0,
    ) -> float:
        """Predicted wall time (ms) of one engine step, start to start when the engine is busy."""
        return (
            self.gpu_ms(prefill_tokens, prefill_pairs, num_decodes, decode_context, context_pairs, longest_context)
            + self.step_overhead_ms
            + self.seq_overhead_ms * num_seqs
        )

    def decode_run_ms(self, num_decodes: int, decode_context: int, steps: int, longest_context: int = 0) -> np.ndarray:
        """Durations (ms) of ``steps`` decode-only steps back to back, the batch's total context growing by
        ``num_decodes`` tokens a step and its longest sequence's by one (each sequence appends one)."""
        a_d, b_d, k_d = self._c[4:]
        j = np.arange(steps, dtype=float)
        return (
            a_d
            + b_d * num_decodes
            + k_d * (decode_context + j * num_decodes)
            + self._cw * (longest_context + j)
            + self.step_overhead_ms
            + self.seq_overhead_ms * num_decodes
        )

    def decode_step_terms(self) -> tuple[float, float, float, float]:
        """A decode-only step as ``fixed + per_decode · B + per_ctx_token · C + per_walk_token · L`` (ms):
        ``(fixed, per_decode, per_ctx_token, per_walk_token)``, overheads included (what ``step_ms`` gives for
        ``B`` decodes over ``C`` cached tokens, the longest sequence holding ``L``)."""
        a_d, b_d, k_d = self._c[4:]
        return a_d + self.step_overhead_ms, b_d + self.seq_overhead_ms, k_d, self._cw

    # ---- variants and storage ------------------------------------------------------------------------
    def with_step_buckets(self, buckets) -> StepCostModel:
        """A copy for a server whose prefill and mixed steps replay captured graphs of these token counts (e.g.
        ``servelab.engine.step_graphs.step_graph_sizes(max_num_batched_tokens)``); ``None`` or empty: none."""
        return replace(self, step_buckets=tuple(sorted({int(x) for x in buckets})) if buckets else ())

    def with_overheads(self, **terms) -> StepCostModel:
        """A copy with some of ``OVERHEAD_TERMS``, ``gpu_form`` and ``source`` replaced."""
        unknown = sorted(set(terms) - set(OVERHEAD_TERMS) - {"source", "gpu_form"})
        if unknown:
            raise ParameterError(f"unknown cost-model term(s) {unknown}; known: {OVERHEAD_TERMS}")
        return replace(self, **terms)

    def as_dict(self) -> dict:
        return {
            "gpu": asdict(self.gpu),
            **{k: getattr(self, k) for k in OVERHEAD_TERMS},
            "gpu_form": self.gpu_form,
            "step_buckets": list(self.step_buckets),
            "source": self.source,
        }

    def save(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path) -> StepCostModel:
        """Read either a ``StepCostModel`` JSON (``save``) or Study 2's plain ``CostModel`` JSON (no overheads)."""
        path = Path(path)
        if not path.exists():
            raise ParameterError(f"cost-model file {str(path)!r} does not exist")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ParameterError(f"{path}: not JSON ({e.msg})") from None
        if "gpu" in d:
            return cls(
                gpu=CostModel(**d["gpu"]),
                **{k: float(d.get(k, 1.0 if k in SCALES else 0.0)) for k in OVERHEAD_TERMS},
                gpu_form=d.get("gpu_form", "phase"),
                step_buckets=tuple(d.get("step_buckets", ())),
                source=d.get("source", path.name),
            )
        try:
            gpu = CostModel(**d)
        except TypeError:
            raise ParameterError(
                f"{path}: neither a StepCostModel nor a Study 2 CostModel JSON (keys {sorted(d)})"
            ) from None
        return cls(gpu=gpu, source=f"Study 2: {path.name}")

    @classmethod
    def constant(cls, step_ms: float) -> StepCostModel:
        """Every step takes ``step_ms`` whatever its batch: time counts steps (tests, the engine comparison)."""
        if isinstance(step_ms, bool) or not isinstance(step_ms, (int, float)) or not step_ms > 0:
            raise ParameterError(f"step_ms must be a positive number, got {step_ms!r}")
        gpu = CostModel(
            "constant",
            "constant",
            dict.fromkeys(PREFILL_TERMS, 0.0) | {"intercept_ms": float(step_ms)},
            dict.fromkeys(DECODE_TERMS, 0.0) | {"intercept_ms": float(step_ms)},
            {},
        )
        return cls(gpu=gpu, source=f"constant {step_ms:g} ms/step")
