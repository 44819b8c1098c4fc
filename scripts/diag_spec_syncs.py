"""Where a speculative step waits for the device: the stack of every sync PyTorch's debug mode reports.

Two rounds of two sequences with a twin draft, every step after the prefill: the setting of the GPU test
``test_on_the_gpu_a_speculative_step_waits_for_the_device_once``. The first warning a process gets is PyTorch's note
that the debug mode is a prototype, not a sync, and ``speculative.syncs.HostSyncs`` counted it
(data/dev/nvidia-h100/2026-12-06/spec_syncs_diag_949817b.log).

    PYTHONPATH=lib python3 scripts/diag_spec_syncs.py      (on a GPU)
"""

import sys
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hf_reference import varied  # noqa: E402

from servelab.engine import EngineConfig, SamplingParams  # noqa: E402
from servelab.engine.speculative_engine import SpeculativeEngine  # noqa: E402
from servelab.models.native import native_from_hf  # noqa: E402
from servelab.speculative.config import SpeculativeConfig  # noqa: E402


def show(message, category, filename, lineno, file=None, line=None):
    print(f"  SYNC {str(message).splitlines()[0][:160]}")
    print("".join(f for f in traceback.format_stack()[:-2] if "servelab" in f)[-1800:])


def main() -> None:
    hf = varied("tiny-llama", 0).cuda()
    cfg = EngineConfig(block_size=16, num_blocks=256, max_model_len=256, max_num_seqs=8)
    draft = SpeculativeConfig("draft_model", 4, model="(given)")
    e = SpeculativeEngine.from_hf(hf, cfg, speculative=draft, draft=native_from_hf(hf, max_positions=256))
    greedy = SamplingParams(max_tokens=12, ignore_eos=True)
    for rep in range(2):
        g = torch.Generator().manual_seed(11 + rep)
        for n in (19, 7):
            e.add_request(torch.randint(3, hf.config.vocab_size, (n,), generator=g).tolist(), greedy)
        e.step()  # the prefill
        i = 0
        while e.has_unfinished():
            print(f"=== rep {rep} step {i}")
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = show
                torch.cuda.set_sync_debug_mode("warn")
                e.step()
                torch.cuda.set_sync_debug_mode("default")
            i += 1


if __name__ == "__main__":
    main()
