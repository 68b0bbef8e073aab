"""Output objects shaped like vLLM's (RequestOutput, CompletionOutput, Logprob)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional


@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


# Per generated token: token id -> Logprob, holding the sampled token and the
# requested number of top alternatives.
SampleLogprobs = List[Dict[int, Logprob]]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[SampleLogprobs] = None
    finish_reason: Optional[str] = None  # "stop", "length", "abort"; None while running
    stop_reason: Optional[str] = None  # the stop string that matched, if any
    error: Optional[str] = None  # why the engine gave up on this sample (finish_reason "abort")

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    time_to_first_token: float = 0.0  # seconds from arrival
    latency: float = 0.0  # seconds from arrival to the last sample's end
    queue_time: float = 0.0
    num_cached_tokens: int = 0
    # Speculative decoding (when the engine runs it): verify steps, draft
    # tokens verified and accepted, over all samples.
    num_verifications: int = 0
    num_verified_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    prompt_logprobs: Optional[Any] = None  # the engine refuses prompt_logprobs for now: always None

    @property
    def num_cached_tokens(self) -> int:
        return self.metrics.num_cached_tokens


def _logprobs(entries: List[Dict[str, Any]], decode: Callable[[int], str]) -> SampleLogprobs:
    result: SampleLogprobs = []
    for e in entries:
        step: Dict[int, Logprob] = {}
        for rank, alt in enumerate(e.get("top_logprobs", []), start=1):
            step[alt["token_id"]] = Logprob(alt["logprob"], rank, decode(alt["token_id"]))
        chosen = e["token_id"]
        if chosen not in step or step[chosen].rank != e.get("rank"):
            step[chosen] = Logprob(e["logprob"], e.get("rank"), decode(chosen))
        result.append(step)
    return result


def _choice(j: Dict[str, Any], index: int, decode: Callable[[int], str]) -> CompletionOutput:
    out = CompletionOutput(
        index=index,
        text=j["text"],
        token_ids=list(j["token_ids"]),
        finish_reason=j.get("finish_reason"),
        stop_reason=j.get("stop_reason"),
        error=j.get("error"),
    )
    if "logprobs" in j:
        out.logprobs = _logprobs(j["logprobs"], decode)
        out.cumulative_logprob = float(sum(e["logprob"] for e in j["logprobs"]))
    if out.finish_reason == "none":
        out.finish_reason = None
    return out


def request_output_from_json(
    j: Dict[str, Any],
    request_id: str,
    prompt: Optional[str],
    prompt_token_ids: List[int],
    decode: Callable[[int], str],
) -> RequestOutput:
    """Builds a RequestOutput from the engine's output object (generate --output's shape)."""
    choices = j.get("choices") or [j]
    metrics = RequestMetrics(
        time_to_first_token=j.get("time_to_first_token_s", 0.0),
        latency=j.get("latency_s", 0.0),
        queue_time=j.get("queue_time_s", 0.0),
        num_cached_tokens=j.get("cached_prompt_tokens", 0),
        num_verifications=j.get("verifications", 0),
        num_verified_draft_tokens=j.get("verified_draft_tokens", 0),
        num_accepted_draft_tokens=j.get("accepted_draft_tokens", 0),
    )
    return RequestOutput(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=prompt_token_ids,
        outputs=[_choice(c, i, decode) for i, c in enumerate(choices)],
        finished=True,
        metrics=metrics,
    )
