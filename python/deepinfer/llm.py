"""The offline API: ``LLM(model=...).generate(prompts, SamplingParams(...))``, as in vLLM."""
from __future__ import annotations

import itertools
import json
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from . import _core
from ._default_model import default_model
from .outputs import CompletionOutput, RequestOutput, _logprobs, request_output_from_json
from .sampling_params import SamplingParams

# A prompt: text, or {"prompt": text} / {"prompt_token_ids": [...]} (vLLM's TextPrompt / TokensPrompt).
PromptType = Union[str, Dict[str, Any]]
Conversation = List[Dict[str, Any]]

# Engine arguments: Python name -> the CLI flag (docs: `deepinfer generate --help`).
_ENGINE_ARGS = {
    "tokenizer": "--tokenizer",
    "chat_template": "--chat-template",
    "device": "--device",
    "threads": "--threads",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "block_size": "--block-size",
    "kv_cache_tokens": "--kv-cache-tokens",
    "kv_cache_memory": "--kv-cache-memory",
    "kv_cache_dtype": "--kv-cache-dtype",
    "quantization": "--quantization",
    "cost_model": "--cost-model",
    "step_time_budget": "--step-time-budget",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "eplb_ep_size": "--eplb-ep-size",
    "eplb_window_steps": "--eplb-window-steps",
    "eplb_interval_steps": "--eplb-interval-steps",
    "eplb_redundant_slots": "--eplb-redundant-slots",
    "routing_trace": "--routing-trace",
    "speculative_config": "--speculative-config",
}
_BOOL_ARGS = {"enforce_eager": "--enforce-eager"}


def _engine_argv(model: str, engine_args: Dict[str, Any]) -> List[str]:
    argv = ["--model", model]
    for name, value in engine_args.items():
        if name == "enable_prefix_caching":
            if not isinstance(value, bool):
                raise TypeError("enable_prefix_caching must be a bool")
            if not value:
                argv.append("--no-enable-prefix-caching")
        elif name in _BOOL_ARGS:
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool")
            if value:
                argv.append(_BOOL_ARGS[name])
        elif name in _ENGINE_ARGS:
            if value is None:
                continue
            if name == "speculative_config" and isinstance(value, dict):
                value = json.dumps(value)
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise TypeError(f"{name} must be a string or a number, not {type(value).__name__}")
            argv += [_ENGINE_ARGS[name], str(value)]
        else:
            known = sorted(list(_ENGINE_ARGS) + list(_BOOL_ARGS) + ["enable_prefix_caching"])
            raise TypeError(f"LLM() got an unknown engine argument '{name}' (known: {', '.join(known)})")
    return argv


class _Progress:
    """A one-line progress bar on stderr (vLLM's use_tqdm)."""

    def __init__(self) -> None:
        self.last = -1

    def __call__(self, finished: int, total: int, generated_tokens: int) -> None:
        width = 30
        filled = width * finished // max(total, 1)
        if filled == self.last and finished != total:
            return
        self.last = filled
        sys.stderr.write(f"\r[{'#' * filled}{' ' * (width - filled)}] {finished}/{total} requests")
        if finished == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


class LLM:
    """An engine for offline inference. ``LLM()`` runs the built-in default model.

    Engine arguments are those of the CLI with underscores (``max_model_len=4096``,
    ``enable_prefix_caching=False``, ``device="cuda"``, ``speculative_config={...}``).
    """

    def __init__(self, model: Optional[str] = None, **engine_args: Any) -> None:
        self.model = model if model is not None else default_model()
        self._engine = _core.Engine(_engine_argv(self.model, engine_args))
        self._ids = itertools.count()
        self._token_text: Dict[int, str] = {}

    # -- helpers ---------------------------------------------------------
    def _decode_token(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._engine.decode([token_id], False)
            self._token_text[token_id] = text
        return text

    @staticmethod
    def _params_list(params: Union[None, SamplingParams, Sequence[SamplingParams]], count: int) -> List[SamplingParams]:
        if params is None:
            return [SamplingParams()] * count
        if isinstance(params, SamplingParams):
            return [params] * count
        params = list(params)
        if len(params) != count:
            raise ValueError(f"got {len(params)} SamplingParams for {count} prompts")
        for p in params:
            if not isinstance(p, SamplingParams):
                raise TypeError(f"sampling_params must be SamplingParams, not {type(p).__name__}")
        return params

    @staticmethod
    def _prompt_request(prompt: PromptType) -> Dict[str, Any]:
        if isinstance(prompt, str):
            return {"prompt": prompt}
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return {"prompt_token_ids": list(prompt["prompt_token_ids"])}
            if "prompt" in prompt and isinstance(prompt["prompt"], str):
                return {"prompt": prompt["prompt"]}
        raise TypeError("a prompt is a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}")

    def _run(self, requests: List[Dict[str, Any]], prompts: List[Optional[str]], use_tqdm: bool) -> List[RequestOutput]:
        texts = [json.dumps(r) for r in requests]
        results = self._engine.generate(texts, _Progress() if use_tqdm else None)
        outputs = []
        for request, prompt, text in zip(requests, prompts, results):
            j = json.loads(text)
            outputs.append(request_output_from_json(j, str(next(self._ids)), prompt, j.get("prompt_token_ids", []),
                                                    self._decode_token))
        return outputs

    # -- public API ------------------------------------------------------
    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
        *,
        use_tqdm: bool = True,
    ) -> List[RequestOutput]:
        """Completes each prompt; outputs come back in the prompts' order. use_tqdm draws a progress
        bar on stderr, as vLLM does."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        params = self._params_list(sampling_params, len(prompts))
        requests = [dict(self._prompt_request(p), **sp.to_dict()) for p, sp in zip(prompts, params)]
        texts = [r.get("prompt") for r in requests]
        return self._run(requests, texts, use_tqdm)

    def chat(
        self,
        messages: Union[Conversation, Sequence[Conversation]],
        sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
        *,
        tools: Optional[List[Dict[str, Any]]] = None,
        use_tqdm: bool = True,
    ) -> List[RequestOutput]:
        """Answers one conversation (a list of messages) or several, with the model's chat template."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise TypeError("messages must be a non-empty list of messages or of conversations")
        conversations = [list(messages)] if isinstance(messages[0], dict) else [list(c) for c in messages]
        params = self._params_list(sampling_params, len(conversations))
        requests = []
        for conv, sp in zip(conversations, params):
            r: Dict[str, Any] = {"messages": conv}
            if tools is not None:
                r["tools"] = tools
            requests.append(dict(r, **sp.to_dict()))
        return self._run(requests, [None] * len(requests), use_tqdm)

    def stream(
        self,
        prompt: Union[PromptType, Conversation],
        sampling_params: Optional[SamplingParams] = None,
    ) -> Iterator[RequestOutput]:
        """Yields the output as it is produced: each RequestOutput carries only the new
        text and token ids (vLLM's delta mode); the last one has ``finished`` set.
        Closing the iterator early aborts the request."""
        params = sampling_params or SamplingParams()
        if isinstance(prompt, list):
            request: Dict[str, Any] = {"messages": prompt}
            prompt_text = None
        else:
            request = self._prompt_request(prompt)
            prompt_text = request.get("prompt")
        request.update(params.to_dict())
        return self._stream(request, prompt_text)

    def _stream(self, request: Dict[str, Any], prompt_text: Optional[str]) -> Iterator[RequestOutput]:
        text = json.dumps(request)
        prompt_ids = self._engine.prompt_token_ids(text)
        handle = self._engine.submit(text)
        request_id = str(next(self._ids))
        n = int(request.get("n", 1))
        finished = [False] * n
        try:
            while not all(finished):
                deltas = json.loads(self._engine.next(handle))
                if not deltas:
                    break
                outs: Dict[int, CompletionOutput] = {}
                for d in deltas:
                    i = d["index"]
                    out = outs.setdefault(i, CompletionOutput(index=i, text="", token_ids=[]))
                    out.text += d["text"]
                    out.token_ids += d["token_ids"]
                    if "logprobs" in d:
                        out.logprobs = (out.logprobs or []) + _logprobs(d["logprobs"], self._decode_token)
                    if d["finished"]:
                        finished[i] = True
                        out.finish_reason = d.get("finish_reason")
                        out.stop_reason = d.get("stop_reason")
                        out.error = d.get("error")
                yield RequestOutput(request_id, prompt_text, prompt_ids, [outs[i] for i in sorted(outs)],
                                    finished=all(finished))
            final = json.loads(self._engine.take(handle))
            handle = None
            # Metrics are known once every sample has ended; attach them to a last, empty delta.
            last = request_output_from_json(final, request_id, prompt_text, prompt_ids, self._decode_token)
            for o in last.outputs:
                o.text, o.token_ids, o.logprobs, o.cumulative_logprob = "", [], None, None
            yield last
        finally:
            if handle is not None:
                self._engine.release(handle)

    def get_tokenizer(self) -> "Tokenizer":
        return Tokenizer(self._engine)

    def stats(self) -> Dict[str, Any]:
        """Engine counters: steps, tokens, prefix-cache hits, device time, speculation."""
        return json.loads(self._engine.stats())


class Tokenizer:
    """The engine's tokenizer and chat template."""

    def __init__(self, engine: "_core.Engine") -> None:
        self._engine = engine

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        return self._engine.encode(text, add_special_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._engine.decode(list(token_ids), skip_special_tokens)

    def apply_chat_template(self, messages: Conversation, tools: Optional[List[Dict[str, Any]]] = None,
                            add_generation_prompt: bool = True) -> str:
        return self._engine.apply_chat_template(json.dumps(messages), json.dumps(tools) if tools else "",
                                                add_generation_prompt)
