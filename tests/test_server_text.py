"""The server's text layer without a server: tokenizers, incremental decoding, stop strings, request parsing."""

import json

import pytest
from pydantic import ValidationError

from servelab.errors import ParameterError
from servelab.server.errors import from_validation_error
from servelab.server.output_text import OutputText
from servelab.server.protocol import ChatCompletionRequest, CompletionRequest, unknown_fields
from servelab.server.tokenizer import ByteTokenizer, HFTokenizer, NoChatTemplate, byte_window


def tiny_hf_tokenizer():
    """A byte-level BPE tokenizer with no merges (one token per byte), 259 ids, and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    hf.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return hf


def decode_all(codec, ids, stops=()):
    out = OutputText(codec.new_decoder([]), list(stops))
    streamed = "".join(out.push(t) for t in ids) + out.finish()
    return streamed, out


# ---- byte-level fallback ---------------------------------------------------------------------------


def test_byte_window_avoids_special_ids_and_fits_the_vocab():
    assert byte_window(512, [1, 2]) == 3  # tiny-llama: bos 1, eos 2
    assert byte_window(512, [0]) == 1  # tiny-gpt2: eos 0
    assert byte_window(151936, [151643]) == 0  # qwen2: specials far above the bytes
    assert byte_window(300, [10]) == 11
    with pytest.raises(ParameterError, match="at least 256"):
        byte_window(100, [])
    with pytest.raises(ParameterError, match="no window"):
        byte_window(300, [40, 260])


def test_byte_tokenizer_round_trips_unicode_split_across_tokens():
    codec = ByteTokenizer(512, [1, 2])
    text = "héllo → 世界 🙂"
    ids = codec.encode(text)
    assert len(ids) == len(text.encode("utf-8")) and all(3 <= i < 259 for i in ids)
    streamed, _ = decode_all(codec, ids)
    assert streamed == text
    # a multi-byte character yields nothing until its last byte arrives
    dec = codec.new_decoder([])
    assert [dec.push(i) for i in codec.encode("é")] == ["", "é"]
    # ids outside the byte window (specials, the rest of the vocabulary) decode to nothing
    assert decode_all(codec, [2, 400] + codec.encode("a"))[0] == "a"
    with pytest.raises(NoChatTemplate):
        codec.chat_prompt([{"role": "user", "content": "hi"}])


# ---- stop strings ------------------------------------------------------------------------------------


def test_stop_string_spanning_tokens_is_cut_and_never_streamed():
    codec = ByteTokenizer(512, [1, 2])
    ids = codec.encode("abc STOP def")
    out = OutputText(codec.new_decoder([]), ["STOP"])
    pieces = []
    for t in ids:
        pieces.append(out.push(t))
        if out.stopped:
            break
    assert out.stopped and out.text == "abc "
    assert "".join(pieces) == "abc " and not any("S" in p for p in pieces)
    assert out.finish() == ""


def test_text_held_back_for_a_possible_stop_is_released_at_the_end():
    codec = ByteTokenizer(512, [1, 2])
    streamed, out = decode_all(codec, codec.encode("xxST"), stops=["STOP"])
    assert streamed == "xxST" and not out.stopped
    # the earliest of several stop strings wins
    streamed, out = decode_all(codec, codec.encode("one two three"), stops=["three", "two"])
    assert out.stopped and streamed == "one " and out.text == "one "


def test_empty_stop_string_is_refused():
    with pytest.raises(ValueError, match="non-empty"):
        OutputText(ByteTokenizer(512).new_decoder([]), [""])


# ---- HF tokenizer ------------------------------------------------------------------------------------


def test_hf_incremental_decoding_equals_full_decoding():
    hf = tiny_hf_tokenizer()
    codec = HFTokenizer(hf)
    text = "Grüße, 世界! ok"
    ids = codec.encode(text)
    assert max(ids) < 259
    streamed, _ = decode_all(codec, ids)
    assert streamed == hf.decode(ids) == text


def test_hf_chat_template_renders_the_conversation():
    codec = HFTokenizer(tiny_hf_tokenizer())
    assert codec.has_chat_template
    ids = codec.chat_prompt([{"role": "user", "content": "hi"}])
    assert codec.decode(ids) == "<|user|>hi\n<|assistant|>"


# ---- request parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),  # no coercion of strings to numbers
        ({"prompt": "x", "temperature": 3.0}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": ["a", 1]}, "prompt"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
        ({"prompt": "x", "top_k": -2}, "top_k"),
        ({"prompt": "x", "min_p": 1.5}, "min_p"),
        ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
        ({}, "prompt"),
    ],
)
def test_bad_completion_bodies_name_the_field(body, param):
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate_json(json.dumps(body))
    err = from_validation_error(e.value)
    assert err.status == 400 and err.param == param
    assert err.body()["error"]["type"] == "invalid_request_error"


def test_malformed_json_is_reported_as_such():
    with pytest.raises(ValidationError) as e:
        CompletionRequest.model_validate_json(b'{"prompt": "x",')
    err = from_validation_error(e.value)
    assert err.status == 400 and err.code == "malformed_json" and "malformed JSON" in err.message


def test_unknown_fields_are_kept_aside_not_refused():
    req = CompletionRequest.model_validate_json(json.dumps({"prompt": "x", "frobnicate": 1, "guided_json": {}}))
    assert unknown_fields(req) == ["frobnicate", "guided_json"]
    chat = ChatCompletionRequest.model_validate_json(
        json.dumps({"messages": [{"role": "assistant", "content": None, "tool_calls": []}], "tools": []})
    )
    assert unknown_fields(chat) == ["tools", "messages.tool_calls"]


def test_unknown_fields_never_walks_a_prompts_token_ids():
    """A list of token ids holds no model to look into: it is not walked (150 µs a 2,112-id prompt, once per request
    of a burst the server takes in before it writes a first token), while a list of models still is."""

    class Untouchable(list):
        def __iter__(self):
            raise AssertionError("a list of token ids was walked")

    req = CompletionRequest.model_validate_json(json.dumps({"prompt": [5] * 2112, "frobnicate": 1}))
    object.__setattr__(req, "prompt", Untouchable(req.prompt))
    assert unknown_fields(req) == ["frobnicate"]
    chat = ChatCompletionRequest.model_validate_json(
        json.dumps({"messages": [{"role": "user", "content": "x", "z": 1}]})
    )
    assert unknown_fields(chat) == ["messages.z"]


def test_unsupported_options_are_listed():
    req = CompletionRequest.model_validate_json(
        json.dumps({"prompt": "x", "n": 2, "logprobs": 3, "echo": True, "best_of": 3, "suffix": "y"})
    )
    assert {p for p, _ in req.unsupported()} == {"best_of", "suffix"}
    assert CompletionRequest.model_validate_json('{"prompt": [1, 2], "n": 2, "best_of": 2}').unsupported() == []
    assert [p for p, _ in CompletionRequest(prompt="x", max_tokens=0).unsupported()] == ["max_tokens"]
    assert CompletionRequest(prompt="x", max_tokens=0, echo=True).unsupported() == []
    fmt = CompletionRequest.model_validate_json('{"prompt": "x", "response_format": {"type": "json_object"}}')
    assert [p for p, _ in fmt.unsupported()] == ["response_format"]
    no_top = ChatCompletionRequest.model_validate_json(
        '{"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}'
    )
    assert [p for p, _ in no_top.unsupported()] == ["top_logprobs"]
    chat = ChatCompletionRequest.model_validate_json(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
                ],
                "stream_options": {"include_usage": True},
            }
        )
    )
    assert chat.messages[0].text() == "ab"
    assert [p for p, _ in chat.unsupported()] == ["stream_options"]  # only with stream=true
