"""The draft model of the engine's speculative mode: its own weights, KV pool, block manager and runner.

Each round the draft proposes up to ``k`` tokens for every speculating sequence at once (``propose``):

1. one step computes what the draft has not seen of each sequence (the whole prompt in its first round; after
   that the one or two tokens the target emitted last round) and samples draft 1 from its last position;
2. ``k - 1`` decode steps follow, each fed the tokens the step before sampled, on the device (``patch_pending``'s
   mechanism: the host never waits between them); on CUDA they replay the draft runner's decode graphs, or, where
   every request is greedy and ``capture_rounds`` captured that many steps, one graph holds them all
   (``draft_rounds``: one launch a round instead of one a step);
3. the host reads the round's drafts once.

The draft keeps one mirror ``Sequence`` per target sequence, keyed by the same id, that holds only its own
progress (``num_computed_tokens``, slots); its token list is the target's, copied each round. After the target
verifies, ``roll_back`` forgets the K/V of the drafts it rejected: the mirror keeps the positions whose tokens
the target kept (blocks past them go back to the draft's block manager). A finished, aborted or preempted
sequence's mirror is ``release``d.

Sizing: the draft's pool has as many blocks as the target's, and a mirror never reserves more positions than its
target sequence, so the draft cannot run out of blocks while the target has them.

Prefix caching: where the target engine caches prefixes, so does the draft, in a cache of its own over its own pool
(its K/V are not the target's). A new mirror starts on the draft's longest cached prefix of its sequence's tokens
(never the last one: the draft samples from it), and a mirror's full blocks of tokens the target has (never its
drafts) are registered as it computes them, so a prompt that shares a prefix with an earlier one costs the draft
only its new tokens, as it costs the target (vLLM's draft model shares the target's block pool and its caching).

vLLM's draft-model proposer (``vllm/v1/spec_decode/draft_model.py``) runs the draft inside the target's runner with
a KV cache of its own; this one is a second ``ModelRunner`` over the draft's pool, which gives it the target's
graphs, kernels and compile check for free.
"""

from __future__ import annotations

import torch

from servelab.engine.compilation import compile_with_check
from servelab.engine.cuda_graphs import power_of_two_buckets
from servelab.engine.draft_rounds import RoundGraphs
from servelab.engine.logits_processing import apply_min_tokens, under_min_tokens
from servelab.engine.model_runner import ModelRunner, max_blocks_per_sequence
from servelab.engine.policies import policy_class
from servelab.engine.rollback import give_back_tail
from servelab.engine.sampling import top_p_filter, valid_rows
from servelab.engine.scheduler import ScheduledBatch, ScheduledSequence, Scheduler
from servelab.engine.sequence import PENDING_TOKEN, Sequence
from servelab.errors import ParameterError
from servelab.kernels import pdl as pdl_launch
from servelab.kv.block_manager import BlockManager
from servelab.kv.pool import KVPool
from servelab.kv.prefix_cache import PrefixCache
from servelab.speculative.rejection import PLACEHOLDER


class _Chained:
    """The previous draft step as ``patch_pending`` reads it: each mirror's row of its sampled tokens."""

    def __init__(self, row_of: dict[int, int], device_tokens: torch.Tensor):
        self.row_of, self.device_tokens = row_of, device_tokens


class Drafts:
    """One round's proposals for B sequences: ``tokens[i]``, sequence i's drafts on the host, and where sampled requests
    need it, the draft's distributions ``probs`` [B, k, vocab] each token was drawn from (None when every request is
    greedy). A draft model's round leaves its tokens on the device (``device`` [B, k], PLACEHOLDER past a sequence's
    count): then ``tokens[i]`` holds ``PENDING_TOKEN`` placeholders, one per draft, and the verify step takes the
    values from the device, so a step waits for the device once."""

    def __init__(self, tokens: list[list[int]], probs: torch.Tensor | None, device: torch.Tensor | None = None):
        self.tokens, self.probs, self.device = tokens, probs, device


class DraftModel:
    def __init__(
        self,
        model,
        *,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int,
        max_model_len: int,
        compile: bool = False,
        cuda_graphs: bool = False,
        backend: str = "gather",
        step_graph_sizes: list[int] | None = None,
        prefix_caching: bool = False,
        prefix_eviction: str = "lru",
        fused_rope_kv_write: bool = False,
        small_batch: bool = False,
        pdl: bool = False,
    ):
        """``backend``: the target engine's attention backend (the draft's layers take it); ``cuda_graphs``: capture
        the draft's decode steps, and with ``step_graph_sizes`` its catch-up steps as whole-step graphs (the ragged
        Triton kernel: a catch-up of one or two tokens a sequence would otherwise launch every kernel of every layer
        from Python, which costs more than the graph-replayed decode steps of the round together).
        ``fused_rope_kv_write``, ``small_batch``: the target engine's settings as it resolved them, taken by the
        draft where its model has the path: a draft step is all small launches, so these cut c most (on the H100
        from 0.20 to 0.14). ``pdl``: the target engine's programmatic dependent launch, as it resolved it
        (``kernels.pdl.bind``)."""
        if model.max_positions < max_model_len:
            raise ParameterError(
                f"the draft model holds {model.max_positions} positions, under max_model_len={max_model_len}"
            )
        p = next(model.parameters())
        self.model, self.device = model, p.device
        for block in model.layers:
            block.attn.backend = backend
        self._take_switches(fused_rope_kv_write, small_batch)
        pdl_launch.bind(model, pdl)
        self.pool = KVPool.for_model(model.shape, num_blocks + 1, block_size, p.dtype, p.device)
        self.pool.kv.zero_()  # masked-out keys enter P·V as 0·value: never 0·NaN
        cache = PrefixCache(block_size, prefix_eviction) if prefix_caching else None
        self.bm = BlockManager(num_blocks, block_size, prefix_cache=cache)
        # the scheduler's slot reservation (whole blocks, OutOfBlocks with nothing changed), with no queue of its own
        self.slots: Scheduler = policy_class("chunked_prefill")(
            self.bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=max(max_num_seqs, max_model_len)
        )
        self.runner = ModelRunner(
            model,
            self.pool,
            self.bm,
            scratch_block=num_blocks,
            max_num_seqs=max_num_seqs,
            max_blocks=max_blocks_per_sequence(max_model_len, block_size),
        )
        self.compile_status = compile_with_check(model, self.pool, num_blocks) if compile else "off"
        self.num_graphs = self.runner.capture_cuda_graphs(max_num_seqs) if cuda_graphs else 0
        if cuda_graphs and step_graph_sizes and backend != "reference":
            self.num_graphs += self.runner.enable_step_graphs(step_graph_sizes, capture=True)
        self.mirrors: dict[int, Sequence] = {}
        # the stops ``min_tokens`` holds back (the target engine's EOS ids, set by it): a draft that proposed EOS
        # where the target may not emit it would have that draft, and every one after it, rejected
        self.eos_token_ids: tuple[int, ...] = ()
        self.rounds: RoundGraphs | None = None
        self.round_graph_rounds = 0  # rounds whose steps after the first ran as one graph

    def _take_switches(self, fused_rope_kv_write: bool, small_batch: bool) -> None:
        """The target's fused RoPE + KV write and small blocks on the draft's model, before compilation and capture
        (a model without the path, or one switched by the caller already, is left as it is)."""
        model = self.model
        if not (fused_rope_kv_write or small_batch) or not hasattr(model, "set_fused_rope_kv_write"):
            return  # (Triton may not import where both are off)
        from servelab.models.small_batch import runs_on, use_small_linear, uses_small_linear

        if uses_small_linear(model):
            return
        if fused_rope_kv_write:
            model.set_fused_rope_kv_write(True)
        if small_batch and runs_on(model):
            use_small_linear(model)

    def capture_rounds(self, steps: int, *, capture: bool = True) -> int:
        """Chain ``steps`` greedy decode steps in one graph per decode bucket (``draft_rounds``): a round of
        ``steps + 1`` drafts then launches twice (its first step, then the rest). ``capture=False`` runs the same
        chained forward eagerly (a CPU, for tests). Returns the graphs captured; 0 with ``steps`` < 1 (γ = 1 has no
        steps after the first)."""
        self.rounds = None
        if steps < 1:
            return 0
        graphs = self.runner.graphs
        if graphs is not None:  # the decode graphs' buckets, so a round fits where its steps would
            buckets = {"batch_sizes": graphs.batch_sizes, "block_widths": graphs.block_widths}
        else:  # as the runner's decode_group buckets an uncaptured run
            most = self.runner.tables.max_blocks
            buckets = {"block_widths": power_of_two_buckets(most, smallest=min(8, most))}
        self.rounds = RoundGraphs(
            self.model,
            self.pool,
            self.runner.tables,
            steps=steps,
            max_batch=self.runner.max_num_seqs,
            scratch_block=self.runner.scratch_block,
            **buckets,
        )
        if capture:
            self.rounds.capture()
        return len(self.rounds.graphs)

    # ---- a round ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int]) -> Drafts:
        """``ks[i] >= 1`` drafts for each target sequence ``seqs[i]``, whose last token the target has not computed yet,
        left on the device. Draws follow each request's temperature and top-p (greedy: the argmax), with its seed."""
        mirrors = []
        for seq, k in zip(seqs, ks, strict=True):
            m = self._mirror(seq)  # after the mirrors before it registered their blocks: it may share them
            self.slots.reserve_slots(m, seq.num_tokens + k - 1)  # positions up to n + k − 2 get the draft's K/V
            self._cache(m, m.num_tokens)  # its tokens so far are the target's (the drafts come after them)
            mirrors.append(m)
        first = ScheduledBatch(
            [
                ScheduledSequence(
                    m,
                    m.num_computed_tokens,
                    m.num_tokens - m.num_computed_tokens,
                    m.kv_slots[m.num_computed_tokens : m.num_tokens],
                )
                for m in mirrors
            ]
        )
        logits = _in_order(*self.runner.logits(first), mirrors)
        tokens, probs = [], []
        token, q = self._draw(logits, mirrors)
        tokens.append(token)
        probs.append(q)
        for m in mirrors:
            m.num_computed_tokens = m.num_tokens
        # a round graph draws argmaxes on the device, where no stop is held back
        chained = self._rest_in_one_graph(mirrors, ks, token) if q is None and not _holding(mirrors) else None
        if chained is not None:
            tokens += chained
            return Drafts([[PENDING_TOKEN] * k for k in ks], None, torch.stack(tokens, dim=1))
        for j in range(1, max(ks)):
            live = [i for i, k in enumerate(ks) if k > j]
            chained = _Chained({mirrors[i].seq_id: i for i in live}, tokens[-1])
            batch = ScheduledBatch()
            for i in live:
                m = mirrors[i]
                m.output_token_ids.append(PENDING_TOKEN)  # draft j, still on the device: patched in
                p = m.num_computed_tokens
                batch.items.append(ScheduledSequence(m, p, 1, [m.kv_slots[p]]))
            logits = _in_order(*self.runner.logits(batch, chained), [mirrors[i] for i in live])
            token, q = self._draw(logits, [mirrors[i] for i in live])
            tokens.append(_scatter(token, live, len(seqs), PLACEHOLDER))
            probs.append(None if q is None else _scatter(q, live, len(seqs), 0.0))
            for i in live:
                mirrors[i].num_computed_tokens += 1
        pending = [[PENDING_TOKEN] * k for k in ks]  # no wait for the device: the verify step reads them there
        stacked = None
        if any(q is not None for q in probs):
            vocab = logits.shape[-1]
            zeros = torch.zeros(len(seqs), vocab, device=self.device)
            stacked = torch.stack([zeros if q is None else q for q in probs], 1)
        return Drafts(pending, stacked, torch.stack(tokens, dim=1))

    def _rest_in_one_graph(self, mirrors: list[Sequence], ks: list[int], first: torch.Tensor):
        """Drafts 2 … k of a greedy round from one graph (``capture_rounds``): a token tensor per step in ``mirrors``'
        order (PLACEHOLDER past a row's count), with each mirror's bookkeeping as the step-by-step path leaves it;
        None where no round graph chains this round's ``max(ks) - 1`` steps, or none of its buckets holds it."""
        steps = max(ks) - 1
        if self.rounds is None or self.rounds.steps != steps:
            return None
        starts = [m.num_computed_tokens for m in mirrors]  # draft 1's position: the first step sampled it
        drafting = [i for i, k in enumerate(ks) if k > 1]
        last = [starts[i] + ks[i] - 2 for i in drafting]
        table_rows = dict(
            zip(
                drafting,
                self.runner.tables.rows_for(
                    [mirrors[i].seq_id for i in drafting],
                    last,
                    [mirrors[i].kv_slots[p] for i, p in zip(drafting, last, strict=True)],
                ),
                strict=True,
            )
        )
        plan = [
            [
                (starts[i] + j, mirrors[i].kv_slots[starts[i] + j], table_rows[i]) if j < ks[i] - 1 else None
                for i in range(len(mirrors))
            ]
            for j in range(steps)
        ]
        out = self.rounds.run(first, plan)
        if out is None:
            return None
        self.round_graph_rounds += 1
        past = torch.tensor([[j >= k - 1 for k in ks] for j in range(steps)])  # a row's steps past its count
        out = out.masked_fill(past.to(out.device, non_blocking=True), PLACEHOLDER)
        for i in drafting:
            m = mirrors[i]
            m.output_token_ids += [PENDING_TOKEN] * (ks[i] - 1)  # drafts 1 … k − 1, still on the device
            m.num_computed_tokens += ks[i] - 1
        return list(out.unbind(0))

    @torch.inference_mode()
    def follow(self, seqs: list[Sequence], ends: list[int]) -> None:
        """Compute the draft's K/V of ``seqs[i]``'s tokens up to ``ends[i]`` (where the target's item ends in a step in
        which that sequence does not draft: a prefill chunk, or a decode the budget left no room to draft for), in
        the same step and with no wait for the device. A prompt reaches the draft chunk by chunk, under the target's
        token budget, instead of whole in the first speculative step (where every running request would wait for it),
        and a speculative step's catch-up is only what the target emitted in the step before."""
        items = []
        for seq, end in zip(seqs, ends, strict=True):
            m = self._mirror(seq)
            if end <= m.num_computed_tokens:
                continue
            self.slots.reserve_slots(m, end)
            self._cache(m, end)
            start = m.num_computed_tokens
            items.append(ScheduledSequence(m, start, end - start, m.kv_slots[start:end]))
        if items:
            self.runner.logits(ScheduledBatch(items))  # the logits of a chunk that ends a prompt go unused
            for it in items:
                it.seq.num_computed_tokens = it.start + it.num_tokens

    def _mirror(self, seq: Sequence) -> Sequence:
        """The draft's sequence for ``seq``: its tokens now (prompt and output), its own progress kept."""
        m = self.mirrors.get(seq.seq_id)
        new = m is None
        if new:
            m = self.mirrors[seq.seq_id] = Sequence(list(seq.prompt_token_ids), seq.params, seq_id=seq.seq_id)
            m.generator = seq.generator
        m.output_token_ids = list(seq.output_token_ids)
        if new:
            self._start_on_cached_prefix(m)
        return m

    def _start_on_cached_prefix(self, m: Sequence) -> None:
        """A new mirror shares the blocks of the draft's longest cached prefix of its tokens, all but the last (the
        draft computes that one to draft from it), as the scheduler admits a request (``_cached_prefix``)."""
        cache = self.bm.prefix_cache
        if cache is None or m.seq_id in self.bm:
            return
        cached = self.bm.match_prefix(m.token_ids(0, m.num_tokens - 1))
        hit = len(cached) * self.bm.block_size
        cache.record_lookup(m.num_tokens, hit)
        if cached:
            self.bm.allocate(m.seq_id, hit, cached)
            m.kv_slots = self.bm.slot_mapping(m.seq_id, 0, hit)
            m.num_computed_tokens = hit

    def _cache(self, m: Sequence, end: int) -> None:
        """Index the mirror's full blocks of positions below ``end``, tokens the target has (never drafts), as soon as
        their slots are reserved, as the scheduler's ``_admit`` does: a mirror later in the same step may share them,
        since every layer of a step writes the whole step's K/V before any attention reads the pool."""
        if self.bm.prefix_cache is not None:
            self.bm.cache_blocks(m.seq_id, end, m.token_ids)

    def _draw(self, logits: torch.Tensor, mirrors: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One draft token per row; with any sampled request, each row's distribution too (one-hot where greedy).
        A row under its ``min_tokens`` draws none of its stops, as the target may not emit them there."""
        if _holding(mirrors):
            logits = apply_min_tokens(logits.float().clone(), mirrors, self.eos_token_ids)
        greedy = logits.argmax(dim=-1)
        sampled = [i for i, m in enumerate(mirrors) if not m.params.greedy]
        if not sampled:
            return greedy, None
        probs = torch.nn.functional.one_hot(greedy, logits.shape[-1]).float()
        dev = logits.device
        idx = torch.tensor(sampled).to(dev, non_blocking=True)
        params = [mirrors[i].params for i in sampled]
        temps = torch.tensor([p.temperature for p in params], dtype=torch.float32).to(dev, non_blocking=True)
        p = torch.softmax(logits[idx].float() / temps[:, None], dim=-1)
        if any(q.top_p < 1 for q in params):
            p = top_p_filter(p, torch.tensor([q.top_p for q in params], dtype=torch.float32).to(dev, non_blocking=True))
        p = valid_rows(p, logits[idx])
        probs[idx] = p
        drawn = torch.empty(len(sampled), dtype=torch.long, device=dev)
        free = [j for j, i in enumerate(sampled) if mirrors[i].generator is None]
        if free:  # the unseeded rows in one draw
            f = torch.tensor(free).to(dev, non_blocking=True)
            drawn[f] = torch.multinomial(p[f], 1)[:, 0]
        for j, i in enumerate(sampled):  # a seeded row draws from its own generator: its tokens ignore the batch
            if mirrors[i].generator is not None:
                drawn[j] = torch.multinomial(p[j], 1, generator=mirrors[i].generator)[0]
        greedy[idx] = drawn
        return greedy, probs

    # ---- after the target verified ------------------------------------------------------------------
    def roll_back(self, seq: Sequence) -> None:
        """Keep the mirror's K/V only where the target kept the tokens. The mirror computed the target's tokens, then
        drafts 1 … k − 1; the target computed its tokens and the drafts it kept: the shorter of the two is what
        both agree on."""
        m = self.mirrors.get(seq.seq_id)
        if m is not None:
            m.num_computed_tokens = min(m.num_computed_tokens, seq.num_computed_tokens)
            give_back_tail(self.bm, self.runner.tables, m)

    def release(self, seq_id: int) -> None:
        """A sequence finished, was aborted or preempted: its mirror and blocks go."""
        m = self.mirrors.pop(seq_id, None)
        if m is not None and seq_id in self.bm:
            self.bm.free(seq_id)
        self.runner.release(seq_id)

    def held(self) -> set[int]:
        """Ids of the sequences the draft holds blocks or a table row for."""
        return set(self.bm.seq_ids) | set(self.runner.tables.row_of)


def _in_order(logits: torch.Tensor, items: list[ScheduledSequence], mirrors: list[Sequence]) -> torch.Tensor:
    """The runner's logits rows (in its flat order: decodes, then new prompts, then chunks over a cached context)
    rearranged to ``mirrors``' order."""
    row = {id(it.seq): r for r, it in enumerate(items)}
    order = [row[id(m)] for m in mirrors]
    if order == list(range(len(order))):
        return logits
    return logits[_device_index(order, logits.device)]


def _scatter(values: torch.Tensor, rows: list[int], size: int, fill) -> torch.Tensor:
    """``values`` (a row per entry of ``rows``) at those rows of a tensor of ``size`` rows; ``fill`` elsewhere."""
    if rows == list(range(size)):  # every sequence still drafting: the common case, nothing to move
        return values
    out = values.new_full((size, *values.shape[1:]), fill)
    out[_device_index(rows, values.device)] = values
    return out


def _device_index(rows: list[int], device) -> torch.Tensor:
    """An index tensor on ``device`` that the host does not wait for. ``torch.tensor(rows, device=cuda)`` is a
    blocking copy: it waited for everything queued, the round's earlier draft steps included, so the host built each
    draft step only after the last one had finished and the GPU idled between them (3.9 ms of a profiled 8.3 ms
    round on the H100, data/dev/nvidia-h100/2026-12-06/spec_engine_cf2a53d.budget.csv)."""
    return torch.tensor(rows).to(device, non_blocking=True)


def _holding(mirrors: list[Sequence]) -> bool:
    """Whether any of ``mirrors`` draws under its ``min_tokens`` (its stops held back)."""
    return any(under_min_tokens(m) for m in mirrors)
