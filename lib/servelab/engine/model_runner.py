"""Runs one scheduled batch through the model: inputs, forward (CUDA graph or eager), sampling.

``launch`` enqueues a step and returns before its tokens are on the host (``inflight.py``); ``execute``
waits for them.

A decode-only step that fits a captured decode bucket replays a decode graph; any other step that fits
a token-count bucket replays a whole-step graph (prefill chunks and decodes together, ``step_graphs``);
the rest (steps larger than every bucket, CPU runs) runs eagerly.
"""

from __future__ import annotations

import torch

from servelab.engine.block_tables import DeviceBlockTables
from servelab.engine.cuda_graphs import DecodeGraphs, power_of_two_buckets
from servelab.engine.inflight import InFlightStep, TokenStaging, patch_pending
from servelab.engine.logprobs import PromptLogprobs, logprobs_of
from servelab.engine.sampling import exponential_race, sample, sample_step
from servelab.engine.scheduler import ScheduledBatch
from servelab.engine.step_graphs import StepGraphs
from servelab.engine.step_inputs import build_step_inputs
from servelab.kv.block_manager import BlockManager


class ModelRunner:
    """Owns the model and the KV pool; ``execute(batch)`` returns one sampled token (or None) per item."""

    def __init__(self, model, pool, bm: BlockManager, *, scratch_block: int, max_num_seqs: int, max_blocks: int):
        self.model, self.pool, self.bm = model, pool, bm
        self.scratch_block = scratch_block  # a pool block the block manager never hands out
        self.device = pool.device
        self.tables = DeviceBlockTables(bm, max_num_seqs, max_blocks, scratch_block, pool.device)
        self.graphs: DecodeGraphs | None = None
        self.step_graphs: StepGraphs | None = None
        self.max_num_seqs = max_num_seqs
        self.varlen = False  # set by the engine once varlen prefill passed its self-check here
        self.graph_steps = 0
        self.step_graph_steps = 0  # prefill and mixed steps replayed from a whole-step graph
        self.eager_steps = 0
        self.decode_groups = 0  # multi-step decode rounds (each counted in graph_steps/eager_steps too)
        self.race = exponential_race  # the whole-batch sampler; the engine swaps in a compiled one
        self.triton_tuning = "n/a"
        self.staging = TokenStaging(max_num_seqs, pool.device)  # where sampled tokens land on the host
        self.eos_token_ids: tuple[int, ...] = ()  # min_tokens keeps these from being sampled (set by the engine)

    def release(self, seq_id) -> None:
        """A sequence finished or was preempted: its block-table row is free."""
        self.tables.release(seq_id)

    def capture_cuda_graphs(self, max_batch: int, progress=None, batch_sizes=None) -> int:
        """Capture decode graphs for batches up to ``max_batch`` (block tables up to their full width)."""
        if self.device.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        backend = self.model.layers[0].attn.backend
        max_blocks = self.tables.max_blocks
        if backend == "triton":  # tile/warps/stages chosen by timing, before any capture
            from servelab.kernels.triton_decode import tune_triton_decode

            s = self.model.shape
            self.triton_tuning = tune_triton_decode(
                s.heads, s.kv_heads, s.head_dim, self.pool.block_size, self.pool.dtype, self.device
            )
        if backend == "gather":
            widths = power_of_two_buckets(max_blocks, smallest=min(8, max_blocks))
        else:  # a paged kernel reads only real lengths; a short width runs short contexts without split-KV's merge
            from servelab.kernels.split_kv import single_pass_blocks

            widths = sorted({min(single_pass_blocks(self.pool.block_size), max_blocks), max_blocks})
        self.graphs = DecodeGraphs(
            self.model,
            self.pool,
            self.tables,
            max_batch=max_batch,
            scratch_block=self.scratch_block,
            block_widths=widths,
            batch_sizes=batch_sizes,
        )
        if progress is not None:
            progress.reset(total=self.graphs.num_graphs)
        self.graphs.capture(progress)
        return self.graphs.num_graphs

    def enable_step_graphs(self, sizes, *, capture: bool, progress=None, split_kv: bool = False) -> int:
        """Run every step that fits one of the token buckets ``sizes`` through ``StepGraphs``; ``capture`` them
        as CUDA graphs (on a CPU, ``capture=False`` runs the same padded steps eagerly, for tests); ``split_kv``: long
        contexts split across programs inside the ragged kernel (``EngineConfig.ragged_split_kv``)."""
        self.step_graphs = StepGraphs(
            self.model,
            self.pool,
            self.tables,
            sizes=sizes,
            max_seqs=self.max_num_seqs,
            scratch_block=self.scratch_block,
            split_kv=split_kv,
        )
        if capture:
            if self.device.type != "cuda":
                raise RuntimeError("CUDA graphs need a CUDA device")
            if progress is not None:
                progress.reset(total=len(self.step_graphs.sizes))
            self.step_graphs.capture(progress)
        return len(self.step_graphs.graphs)

    @torch.inference_mode()
    def logits(self, batch: ScheduledBatch, previous: InFlightStep | None = None):
        """``(logits [S, vocab], items)`` for the S items of ``batch`` that sample this step.

        Tokens still pending on the host (sampled by ``previous``, the step in flight) are taken from its
        device tensor, so the step launches without waiting for them.
        """
        items = batch.items

        def patch(ids):
            patch_pending(ids, items, previous)

        if self.graphs is not None and batch.is_decode_only:
            positions = [it.start for it in items]
            slots = [it.slots[0] for it in items]
            rows = self.tables.rows_for([it.seq.seq_id for it in items], positions, slots)
            out = self.graphs.run([it.seq.token_at(it.start) for it in items], positions, slots, rows, patch)
            if out is not None:
                if self.graphs.graphs:
                    self.graph_steps += 1
                else:
                    self.eager_steps += 1
                keep = [i for i, it in enumerate(items) if it.samples]
                if len(keep) < len(items):  # a one-token prefill chunk that does not finish its prompt
                    out = out[torch.tensor(keep).to(out.device, non_blocking=True)]
                return out, [items[i] for i in keep]
        if self.step_graphs is not None:
            ran = self.step_graphs.run(items, patch)
            if ran is not None:
                self.step_graph_steps += 1
                return ran
        self.eager_steps += 1
        x = build_step_inputs(batch, self.tables, self.device, varlen=self.varlen)
        patch_pending(x.input_ids, x.ordered_items, previous)
        out = self.model(x.input_ids, x.positions, x.meta, self.pool, x.logits_indices)
        return out, x.sampling_items

    @torch.inference_mode()
    def decode_group(self, items, steps: list[int]) -> list[list[int]] | None:
        """Run ``K = max(steps)`` decode steps back to back; item i takes part in its first ``steps[i]``.

        Every item must be a decode whose slots for positions ``start … start + steps[i] - 1`` are reserved.
        Tokens sampled in one step are the next step's inputs without a trip to the host; the host sees
        all of them once, at the end: ``tokens[j][i]`` (entries past ``steps[i]`` are meaningless).
        Returns None when no captured bucket holds the group.
        """
        if self.graphs is None:  # CPU or graphs off: the same packed-input path, run eagerly
            max_blocks = self.tables.max_blocks
            self.graphs = DecodeGraphs(
                self.model,
                self.pool,
                self.tables,
                max_batch=self.tables.pad_row,
                scratch_block=self.scratch_block,
                # widths bucketed as the gather backend's graphs are: at full width every step would attend over
                # max_model_len keys per sequence, a hundred times a short request's context
                block_widths=power_of_two_buckets(max_blocks, smallest=min(8, max_blocks)),
            )
        last = [it.start + k - 1 for it, k in zip(items, steps, strict=True)]
        rows = self.tables.rows_for(
            [it.seq.seq_id for it in items], last, [it.seq.kv_slots[p] for it, p in zip(items, last, strict=True)]
        )
        plan = [
            [
                (it.start + j, it.seq.kv_slots[it.start + j], r) if j < k else None
                for it, k, r in zip(items, steps, rows, strict=True)
            ]
            for j in range(max(steps))
        ]
        params, gens = [it.seq.params for it in items], [it.seq.generator for it in items]
        tokens = self.graphs.run_steps(
            [it.seq.token_at(it.start) for it in items], plan, lambda logits: sample(logits, params, gens, self.race)
        )
        if tokens is None:
            return None
        self.decode_groups += 1
        if self.graphs.graphs:
            self.graph_steps += len(plan)
        else:
            self.eager_steps += len(plan)
        return tokens.tolist()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, previous: InFlightStep | None = None) -> InFlightStep:
        """Enqueue ``batch``'s forward and sampling and the copy of its tokens to the host; return without
        waiting for the GPU (``InFlightStep.tokens()`` waits). ``previous``: the step still in flight."""
        for src, dst in self.bm.take_copies():  # copy-on-write of shared blocks, before any K/V is written
            self.pool.copy_blocks([(src, dst)])
        start = self.staging.timing_event()
        prompt = None
        if any(it.seq.needs_prompt_logprobs for it in batch.items):
            logits, items, prompt = self._logits_and_prompt_logprobs(batch, previous)
        else:
            logits, items = self.logits(batch, previous)
        tokens, logprobs = (
            sample_step(logits, [it.seq for it in items], self.race, self.eos_token_ids) if items else (None, None)
        )
        return self.staging.stage(batch, items, tokens, start, logprobs, prompt)

    def _logits_and_prompt_logprobs(self, batch: ScheduledBatch, previous: InFlightStep | None):
        """``logits()`` for a step in which some prefill chunk needs prompt logprobs: always eager (graphs compute
        only the sampling rows' logits), with those positions' logits as extra rows scored on the device."""
        self.eager_steps += 1
        x = build_step_inputs(batch, self.tables, self.device, varlen=self.varlen, prompt_logprobs=True)
        patch_pending(x.input_ids, x.ordered_items, previous)
        out = self.model(x.input_ids, x.positions, x.meta, self.pool, x.logits_indices)
        s = len(x.sampling_items)
        prompt = None
        if x.prompt_spans:
            ks = [seq.params.prompt_logprobs for seq, _, count in x.prompt_spans for _ in range(count)]
            targets = torch.tensor(x.prompt_targets).to(self.device, non_blocking=True)
            prompt = PromptLogprobs(x.prompt_spans, logprobs_of(out[s:], targets, ks))
        return out[:s], x.sampling_items, prompt

    def execute(self, batch: ScheduledBatch) -> list[int | None]:
        """Run ``batch`` and wait for its tokens: one sampled token (or None) per item."""
        step = self.launch(batch)
        by_seq = dict(zip(step.row_of, step.tokens(), strict=True))
        return [by_seq.get(it.seq.seq_id) for it in batch.items]


def max_blocks_per_sequence(max_model_len: int, block_size: int) -> int:
    return -(-max_model_len // block_size)
