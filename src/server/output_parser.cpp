#include "server/output_parser.h"

#include "server/protocol.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <vector>

namespace deepinfer::server {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";

// The markers around one call, and the ones dropped between calls.
struct BlockMarkers {
  std::string_view open, close;
  std::vector<std::string_view> dropped;
};

const BlockMarkers& block_markers(ToolCallFormat f) {
  static const BlockMarkers hermes{kToolOpen, kToolClose, {}};
  static const BlockMarkers deepseek{kDsCallBegin, kDsCallEnd, {kDsCallsBegin, kDsCallsEnd}};
  return f == ToolCallFormat::DeepSeekV3 ? deepseek : hermes;
}

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t partial_marker_suffix(std::string_view text, std::string_view marker) {
  const size_t max = std::min(text.size(), marker.size() - 1);
  for (size_t n = max; n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

size_t skip_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  return i;
}

}  // namespace

ToolCallFormat tool_call_format_for_template(const std::string& t) {
  if (t.find("<tool_call>") != std::string::npos) return ToolCallFormat::Hermes;
  if (t.find(kDsCallBegin) != std::string::npos) return ToolCallFormat::DeepSeekV3;
  if (t.find("<|python_tag|>") != std::string::npos || t.find("ipython") != std::string::npos) {
    return ToolCallFormat::Llama3Json;
  }
  return ToolCallFormat::Hermes;
}

bool template_has_reasoning(const std::string& t) { return t.find("<think>") != std::string::npos || t.find("</think>") != std::string::npos; }

bool parse_deepseek_tool_call(std::string_view body, ParsedToolCall& out) {
  // TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```
  const size_t sep = body.find(kDsSep);
  if (sep == std::string_view::npos) return false;
  std::string_view rest = body.substr(sep + kDsSep.size());
  const size_t nl = rest.find('\n');
  if (nl == std::string_view::npos || nl == 0) return false;
  out.name = std::string(rest.substr(0, nl));
  std::string_view args = rest.substr(nl + 1);
  constexpr std::string_view kFenceOpen = "```json", kFence = "```";
  args.remove_prefix(skip_space(args));
  if (args.substr(0, kFenceOpen.size()) != kFenceOpen) return false;
  args.remove_prefix(kFenceOpen.size());
  const size_t end = args.rfind(kFence);
  if (end == std::string_view::npos) return false;
  std::optional<nlohmann::ordered_json> parsed = parse_embedded_json(args.substr(0, end));
  if (!parsed || !parsed->is_object()) return false;
  out.arguments = dump_json(*parsed);
  return true;
}

bool parse_tool_call_json(std::string_view text, ParsedToolCall& out) {
  std::optional<nlohmann::ordered_json> parsed = parse_embedded_json(text);
  if (!parsed) return false;
  const nlohmann::ordered_json& j = *parsed;
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  const nlohmann::ordered_json* args = nullptr;
  if (j.contains("arguments")) args = &j["arguments"];
  else if (j.contains("parameters")) args = &j["parameters"];
  out.name = j["name"].get<std::string>();
  if (!args || args->is_null()) {
    out.arguments = "{}";
  } else if (args->is_string()) {
    out.arguments = args->get<std::string>();
  } else {
    out.arguments = dump_json(*args);
  }
  return true;
}

OutputParser::OutputParser(ToolCallFormat tools, bool reasoning)
    : format_(tools),
      think_(reasoning ? Think::Undecided : Think::Done),
      tool_(tools == ToolCallFormat::Llama3Json ? Tool::Undecided : Tool::Content) {}

ParsedDelta OutputParser::push(std::string_view text) {
  ParsedDelta out;
  if (think_ == Think::Done) {
    if (after_think_) {
      // The reply usually starts after a blank line; that is not content.
      text.remove_prefix(skip_space(text));
      if (text.empty()) return out;
      after_think_ = false;
    }
    push_content(text, out, false);
    return out;
  }
  think_buf_.append(text);
  if (think_ == Think::Undecided) {
    const size_t ws = skip_space(think_buf_);
    std::string_view rest = std::string_view(think_buf_).substr(ws);
    if (rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest) return out;  // maybe <think>
    if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
      think_ = Think::Inside;
      think_buf_.erase(0, ws + kThinkOpen.size());
    } else {
      think_ = Think::Done;
      std::string buf = std::move(think_buf_);
      think_buf_.clear();
      push_content(buf, out, false);
      return out;
    }
  }
  const size_t close = think_buf_.find(kThinkClose);
  if (close != std::string::npos) {
    out.reasoning = think_buf_.substr(0, close);
    std::string rest = think_buf_.substr(close + kThinkClose.size());
    think_buf_.clear();
    think_ = Think::Done;
    after_think_ = true;
    ParsedDelta tail = push(rest);
    out.content = std::move(tail.content);
    out.tool_calls = std::move(tail.tool_calls);
    return out;
  }
  const size_t hold = partial_marker_suffix(think_buf_, kThinkClose);
  out.reasoning = think_buf_.substr(0, think_buf_.size() - hold);
  think_buf_.erase(0, think_buf_.size() - hold);
  return out;
}

void OutputParser::push_content(std::string_view text, ParsedDelta& out, bool final) {
  if (format_ == ToolCallFormat::None) {
    out.content.append(text);
    return;
  }
  tool_buf_.append(text);
  if (format_ == ToolCallFormat::Llama3Json) {
    if (tool_ == Tool::Undecided) {
      std::string_view rest = std::string_view(tool_buf_).substr(skip_space(tool_buf_));
      if (rest.empty() && !final) return;
      const bool tag_prefix = rest.size() < kPythonTag.size() && kPythonTag.substr(0, rest.size()) == rest;
      if (tag_prefix && !final) return;
      tool_ = (!rest.empty() && rest[0] == '{') || rest.substr(0, kPythonTag.size()) == kPythonTag ? Tool::Json
                                                                                                   : Tool::Content;
    }
    if (tool_ == Tool::Content) {
      out.content += tool_buf_;
      tool_buf_.clear();
      return;
    }
    if (!final) return;  // a JSON reply is parsed whole
    std::string_view body = std::string_view(tool_buf_).substr(skip_space(tool_buf_));
    if (body.substr(0, kPythonTag.size()) == kPythonTag) body.remove_prefix(kPythonTag.size());
    std::vector<ParsedToolCall> calls;
    bool ok = true;
    size_t start = 0;
    std::string s(body);
    while (start < s.size() && ok) {
      size_t end = s.find(';', start);
      std::string part = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (part.find_first_not_of(" \n\t\r") != std::string::npos) {
        ParsedToolCall call;
        ok = parse_tool_call_json(part, call);
        if (ok) calls.push_back(std::move(call));
      }
      if (end == std::string::npos) break;
      start = end + 1;
    }
    if (ok && !calls.empty()) {
      for (auto& c : calls) out.tool_calls.push_back(std::move(c));
    } else {
      out.content += tool_buf_;
    }
    tool_buf_.clear();
    return;
  }
  push_tagged(out, final);
}

bool OutputParser::parse_block(std::string_view body, ParsedToolCall& call) const {
  return format_ == ToolCallFormat::DeepSeekV3 ? parse_deepseek_tool_call(body, call) : parse_tool_call_json(body, call);
}

// Any number of tagged call blocks between content; markers that only group
// calls (DeepSeek-V3's calls begin/end) are dropped from the content.
void OutputParser::push_tagged(ParsedDelta& out, bool final) {
  const BlockMarkers& m = block_markers(format_);
  for (;;) {
    if (tool_ == Tool::Content) {
      // The earliest marker: a call's opening, or one to drop.
      size_t at = tool_buf_.find(m.open);
      std::string_view marker = m.open;
      for (std::string_view d : m.dropped) {
        const size_t p = tool_buf_.find(d);
        if (p < at) at = p, marker = d;
      }
      if (at == std::string::npos) {
        size_t hold = 0;
        if (!final) {
          hold = partial_marker_suffix(tool_buf_, m.open);
          for (std::string_view d : m.dropped) hold = std::max(hold, partial_marker_suffix(tool_buf_, d));
        }
        out.content += tool_buf_.substr(0, tool_buf_.size() - hold);
        tool_buf_.erase(0, tool_buf_.size() - hold);
        return;
      }
      out.content += tool_buf_.substr(0, at);
      tool_buf_.erase(0, at + marker.size());
      if (marker != m.open) continue;
      tool_ = Tool::InCall;
      call_scanned_ = 0;
    }
    // A tag split across pieces starts at most len - 1 bytes before the end.
    const size_t from = call_scanned_ >= m.close.size() ? call_scanned_ - m.close.size() + 1 : 0;
    const size_t close = tool_buf_.find(m.close, from);
    if (close == std::string::npos) {
      call_scanned_ = tool_buf_.size();
      if (!final) return;
      // Generation ended inside a call (the model stopped at EOS before the tag).
      ParsedToolCall call;
      if (parse_block(tool_buf_, call)) {
        out.tool_calls.push_back(std::move(call));
      } else {
        out.content += std::string(m.open) + tool_buf_;
      }
      tool_buf_.clear();
      tool_ = Tool::Content;
      return;
    }
    ParsedToolCall call;
    if (parse_block(std::string_view(tool_buf_).substr(0, close), call)) {
      out.tool_calls.push_back(std::move(call));
    } else {
      out.content += std::string(m.open) + tool_buf_.substr(0, close + m.close.size());
    }
    tool_buf_.erase(0, close + m.close.size());
    tool_ = Tool::Content;
    call_scanned_ = 0;
  }
}

ParsedDelta OutputParser::finish() {
  ParsedDelta out;
  if (think_ != Think::Done) {
    // Unclosed reasoning stays reasoning; an undecided opening was content.
    if (think_ == Think::Inside) {
      out.reasoning = std::move(think_buf_);
    } else {
      push_content(think_buf_, out, false);
    }
    think_buf_.clear();
    think_ = Think::Done;
  }
  push_content("", out, true);
  return out;
}

}  // namespace deepinfer::server
