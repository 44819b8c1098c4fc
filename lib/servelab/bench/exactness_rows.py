"""``exactness.csv``: greedy agreement and logit error against HF in the plan's dtype, on the default
configuration (and with eager blocks too where the default compiles them)."""

from __future__ import annotations

from servelab.bench.session import BenchSession

PROMPT_LENGTHS = (7, 33, 120, 300)


def agreement(s: BenchSession, spec: str, model, compile_):
    """One model's agreement table under one ``compile`` setting."""
    import torch

    from servelab.bench.exactness import greedy_agreement
    from servelab.engine import Engine, EngineConfig

    p = s.plan
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(p.seed)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PROMPT_LENGTHS[: p.exactness_prompts]]
    cfg = EngineConfig(
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        max_model_len=512,
        num_blocks=256,
        compile=compile_,
        graph_batch_sizes=(1, 2, 4),
    )
    eng = Engine.from_hf(model, cfg)
    df = greedy_agreement(model, eng, prompts, p.exactness_steps)
    df.insert(0, "model", spec)
    df.insert(1, "dtype", p.dtype)
    graphs = "CUDA graphs" if eng.num_graphs else "eager"
    df.insert(2, "engine", f"{eng.backend}, compile {eng.compile_status}, {graphs}")
    s.log(
        f"exactness {spec} compile={compile_}: tokens agree for {df['tokens_agree'].tolist()} of "
        f"{p.exactness_steps} steps; max |logit err| {df['logit_max_abs_err'].max():.3g}; teacher-forced "
        f"argmax agreement {df['tf_argmax_agree_frac'].mean():.3f}"
    )
    return df


def exactness_section(s: BenchSession) -> None:
    p = s.plan
    settings = ["auto", False] if s.cuda else ["auto"]  # "auto" is eager on a CPU: one run says it all
    for spec in (p.model, *p.exactness_models):
        for compile_ in settings:
            if s.clock.left() < 30:
                s.log(f"exactness {spec} compile={compile_}: skipped (time budget)")
                continue
            model = None
            try:
                model = s.hf if spec == p.model else s.load(spec)
                s.exact.append(agreement(s, spec, model, compile_))
            except Exception as e:
                s.log(f"exactness {spec}: failed: {type(e).__name__}: {e}")
            finally:
                model = None
                s.free()
    s.flush()
