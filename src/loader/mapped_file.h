// MappedFile: a whole file mapped read-only into memory (RAII). Model weights are
// read in place from the mapping, so opening a multi-GB checkpoint costs no copy
// and pages are loaded by the OS on first touch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace deepinfer {

class MappedFile {
 public:
  // Throws deepinfer::Error if the file is missing, unreadable, not a regular
  // file, or empty (a zero-length mapping is not possible and no model file is empty).
  static MappedFile open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace deepinfer
