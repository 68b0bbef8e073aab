// Added tokens (special and normal) are found in the text before the model sees
// it: leftmost-longest matching, with tokenizers' lstrip/rstrip/single_word rules.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::tok {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

// A piece of text: either plain text still to be tokenized, or one added token.
struct Segment {
  std::string_view text;
  int32_t token = -1;  // >= 0: this segment is added token `token`
};

class AddedTokenMatcher {
 public:
  void add(const AddedToken& token);
  bool empty() const { return tokens_.empty(); }
  // Cuts text into plain segments and added-token segments (whitespace absorbed by
  // lstrip/rstrip tokens is dropped). Appends to out.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                       // index into tokens_
  };
  int32_t child(int32_t node, unsigned char c) const;
  std::vector<Node> nodes_{Node{}};
  std::vector<AddedToken> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace deepinfer::tok
