"""KV rollback ("KV sync"): after a round, both caches hold exactly the accepted prefix.

Checked round by round with a random draft (frequent rejections): the block counts equal those of the prefix, and
the next step's logits equal those of a fresh model that prefilled the same prefix.
"""

import pytest
import torch

from servelab.engine import SamplingParams
from servelab.kv.block_manager import BlockManager
from servelab.models import load_model
from servelab.spec import PagedLM, greedy_accept
from servelab.spec.proposer import DraftProposer
from servelab.spec.rollback import rollback
from servelab.spec.verifier import TargetVerifier

BS = 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: one intra-op thread


@pytest.fixture(scope="module")
def models():
    return load_model("config:tiny-llama", seed=0).model, load_model("config:tiny-llama", seed=3).model


def _fresh_next_logits(hf, prefix, pending):
    lm = PagedLM.from_hf(hf, 128, 2, block_size=BS)
    lm.forward(prefix)
    return lm.forward([pending])


def test_both_caches_hold_exactly_the_accepted_prefix_after_each_round(models):
    target_hf, draft_hf = models
    target = PagedLM.from_hf(target_hf, 128, 6, name="target", block_size=BS)
    draft = PagedLM.from_hf(draft_hf, 128, 2, name="draft", block_size=BS)
    prompt = list(range(5, 18))
    committed = prompt + [int(target.forward(prompt, last_only=True).argmax())]
    draft.forward(prompt)
    proposer, verifier, greedy = DraftProposer(draft), TargetVerifier(target), SamplingParams()
    rejected_rounds = 0
    for _ in range(6):
        gamma = 5
        prop = proposer.propose(committed, gamma, greedy)
        logits = verifier.score(committed[-1], prop.tokens)
        assert target.num_cached == len(committed) + gamma and draft.num_cached == len(committed) + gamma - 1
        acc = greedy_accept(logits, torch.tensor(prop.tokens))
        sync = rollback(target, draft, len(committed), acc.accepted, gamma)
        committed += prop.tokens[: acc.accepted] + [acc.next_token]
        rejected_rounds += acc.accepted < gamma
        assert sync.target_dropped == gamma - acc.accepted
        # the target holds every committed token but the pending last one; the draft too, or one fewer
        assert target.tokens == committed[:-1]
        assert draft.tokens == committed[: len(draft.tokens)] and len(committed) - 2 <= draft.num_cached
        for lm in (target, draft):
            assert lm.bm.num_tokens(lm.seq_id) == lm.num_cached
            assert len(lm.bm.block_table(lm.seq_id)) == -(-lm.num_cached // BS)
            assert lm.bm.num_used_blocks == -(-lm.num_cached // BS)  # nothing leaked
        # what comes next equals a fresh run over the same prefix
        fresh = _fresh_next_logits(target_hf, committed[:-1], committed[-1])
        nxt = target.forward([committed[-1]])
        torch.testing.assert_close(nxt, fresh, rtol=1e-5, atol=1e-5)
        target.truncate(len(committed) - 1)
    assert rejected_rounds > 0  # the test saw rollbacks


def test_truncate_then_regrow_writes_into_reused_blocks(models):
    hf, _ = models
    lm = PagedLM.from_hf(hf, 64, 4, block_size=BS)
    seq = list(range(3, 30))
    ref = PagedLM.from_hf(hf, 64, 4, block_size=BS)
    ref.forward(seq[:20])
    ref_logits = ref.forward(seq[20:23])
    lm.forward(seq[:10])
    lm.forward(seq[10:13])
    lm.truncate(9)  # back across a block boundary
    assert lm.bm.num_used_blocks == 3
    lm.forward(seq[9:20])  # regrow: the stale slots are overwritten
    torch.testing.assert_close(lm.forward(seq[20:23]), ref_logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot truncate"):
        lm.truncate(lm.num_cached + 1)
    lm.truncate(0)
    assert lm.bm.num_used_blocks == 0 and lm.seq_id is None


def test_block_manager_truncate_frees_blocks_and_respects_sharing():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("a", 10)  # 3 blocks
    bm.fork("a", "b")
    assert bm.truncate("a", 5) == []  # the third block is still held by "b"
    assert bm.block_table("a") == bm.block_table("b")[:2] and bm.num_tokens("a") == 5
    freed = bm.truncate("b", 6)  # now nobody holds the third block
    assert len(freed) == 1 and bm.num_used_blocks == 2
    bm.append("a", 3)  # "a" and "b" share a partly filled block: copied on write
    assert bm.take_copies() and bm.num_tokens("a") == 8
    with pytest.raises(ValueError, match="cannot truncate"):
        bm.truncate("a", 9)
    with pytest.raises(ValueError, match="non-negative"):
        bm.truncate("a", -1)
    with pytest.raises(KeyError):
        bm.truncate("zzz", 0)
