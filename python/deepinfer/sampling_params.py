"""Sampling parameters with vLLM's names and defaults.

Ranges are checked by the engine (the same checks the server applies); a value
out of range raises ``deepinfer.ParamError`` naming the field.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Union


@dataclass
class StructuredOutputsParams:
    """Constrains the output: exactly one of the fields (vLLM's StructuredOutputsParams)."""

    json: Optional[Union[str, Dict[str, Any]]] = None  # a JSON Schema (object or text)
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None  # EBNF (GBNF) or Lark
    json_object: Optional[bool] = None  # any JSON object
    whitespace_pattern: Optional[str] = None
    disable_any_whitespace: Optional[bool] = None

    def to_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16  # vLLM's default; None = up to the context length
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: Optional[Dict[int, float]] = None
    structured_outputs: Optional[StructuredOutputsParams] = None
    extra_args: Dict[str, Any] = field(default_factory=dict)  # passed to the engine as they are

    def to_dict(self) -> Dict[str, Any]:
        """The request fields the engine reads (those left at None are omitted)."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra_args" or value is None:
                continue
            if f.name == "structured_outputs":
                if not isinstance(value, StructuredOutputsParams):
                    raise TypeError("structured_outputs must be a StructuredOutputsParams")
                value = value.to_dict()
            elif f.name == "logit_bias":
                value = {str(k): v for k, v in value.items()}
            out[f.name] = value
        out.update(self.extra_args)
        return out
