// Helpers the dist tests share: ranks as threads of this process, each with
// its own communicator over a store of one of three kinds, and host buffers
// of any collective dtype written and read as doubles.
#pragma once

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/half.h"
#include "core/tensor.h"
#include "dist/gloo_communicator.h"
#include "dist/tcp_store.h"

namespace deepinfer::dist_test {

using namespace std::chrono_literals;

enum class StoreKind { Hash, File, Tcp };

inline std::string store_kind_name(StoreKind k) {
  switch (k) {
    case StoreKind::Hash: return "hash";
    case StoreKind::File: return "file";
    case StoreKind::Tcp: return "tcp";
  }
  return "?";
}

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("deepinfer_dist_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The stores of one test: a shared HashStore, a FileStore per rank on one
// directory, or a TcpStore per rank whose rank 0 serves on a free loopback port.
class TestStores {
 public:
  TestStores(StoreKind kind, int size, std::chrono::milliseconds timeout) : kind_(kind), stores_(size) {
    if (kind == StoreKind::Hash) {
      auto shared = std::make_shared<gloo::rendezvous::HashStore>();
      for (auto& s : stores_) s = shared;
    } else if (kind == StoreKind::File) {
      for (auto& s : stores_) s = std::make_shared<gloo::rendezvous::FileStore>(dir_.path().string());
    } else {
      auto server = std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", 0, true, timeout});
      stores_[0] = server;
      for (size_t r = 1; r < stores_.size(); ++r) {
        stores_[r] = std::make_shared<TcpStore>(TcpStoreOptions{"127.0.0.1", server->port(), false, timeout});
      }
    }
  }
  std::shared_ptr<gloo::rendezvous::Store> for_rank(int r) const { return stores_[static_cast<size_t>(r)]; }

 private:
  StoreKind kind_;
  TempDir dir_;
  std::vector<std::shared_ptr<gloo::rendezvous::Store>> stores_;
};

inline const GlooTransport kLoopback{"", "127.0.0.1"};

// Runs body(comm) for every rank of a group of `size` on its own thread and
// rethrows the first exception any rank threw.
inline void run_ranks(int size, StoreKind kind, const std::function<void(GlooCommunicator&)>& body,
                      std::chrono::milliseconds timeout = 20s) {
  TestStores stores(kind, size, timeout);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        GlooCommunicator comm(stores.for_rank(r), "test", r, size, timeout, kLoopback);
        body(comm);
        // Nobody leaves while a peer may still be reading from it.
        comm.barrier();
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// A host buffer of n elements of dtype, written from and read as doubles.
class HostBuffer {
 public:
  HostBuffer(DType dtype, int64_t n) : dtype_(dtype), n_(n), bytes_(static_cast<size_t>(n) * elem_bytes(dtype)) {}

  static size_t elem_bytes(DType t) { return static_cast<size_t>(dtype_info(t).block_bytes); }

  Tensor tensor() { return Tensor(bytes_.data(), dtype_, {n_}); }
  Tensor tensor(std::initializer_list<int64_t> shape) { return Tensor(bytes_.data(), dtype_, shape); }
  int64_t size() const { return n_; }

  void set(int64_t i, double v) {
    uint8_t* p = bytes_.data() + static_cast<size_t>(i) * elem_bytes(dtype_);
    switch (dtype_) {
      case DType::F32: {
        const auto f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DType::F16: {
        const uint16_t h = f32_to_f16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::BF16: {
        const uint16_t h = f32_to_bf16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::I32: {
        const auto x = static_cast<int32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DType::I64: {
        const auto x = static_cast<int64_t>(v);
        std::memcpy(p, &x, 8);
        break;
      }
      case DType::U8: *p = static_cast<uint8_t>(v); break;
      default: FAIL() << "unsupported dtype in the test";
    }
  }

  double get(int64_t i) const {
    const uint8_t* p = bytes_.data() + static_cast<size_t>(i) * elem_bytes(dtype_);
    switch (dtype_) {
      case DType::F32: {
        float f;
        std::memcpy(&f, p, 4);
        return f;
      }
      case DType::F16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        return f16_to_f32(h);
      }
      case DType::BF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        return bf16_to_f32(h);
      }
      case DType::I32: {
        int32_t x;
        std::memcpy(&x, p, 4);
        return x;
      }
      case DType::I64: {
        int64_t x;
        std::memcpy(&x, p, 8);
        return static_cast<double>(x);
      }
      case DType::U8: return *p;
      default: return 0;
    }
  }

 private:
  DType dtype_;
  int64_t n_;
  std::vector<uint8_t> bytes_;
};

}  // namespace deepinfer::dist_test
