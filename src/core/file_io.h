// Opening files the engine reads as data (model files, tokenizer files). A
// path may name a FIFO or a device: opening those for reading blocks until a
// writer appears, or reads forever, so the type is checked on a descriptor
// opened without blocking, before a single byte is read.
#pragma once

#include <cstdint>
#include <string>

namespace deepinfer {

// A read-only descriptor of a regular file (the caller closes it). Throws
// deepinfer::Error naming the path when it cannot be opened or is a FIFO,
// socket, device or folder.
int open_regular_file(const std::string& path);

// The whole content of a regular file of at most `max_bytes` bytes.
std::string read_regular_file(const std::string& path, uint64_t max_bytes);

}  // namespace deepinfer
