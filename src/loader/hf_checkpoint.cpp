#include "loader/hf_checkpoint.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/json_parse.h"
#include "loader/mapped_file.h"

namespace deepinfer {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_json(const fs::path& path) {
  MappedFile file = MappedFile::open(path.string());
  return parse_json({reinterpret_cast<const char*>(file.data()), file.size()}, path.string());
}

// Shards must sit in the checkpoint folder itself: an index must not reach
// elsewhere through absolute paths or "..".
void check_shard_name(const std::string& name, const fs::path& index) {
  DI_CHECK(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
               name.find('\\') == std::string::npos,
           "{}: weight_map names '{}', which is not a file name in the checkpoint folder", index.string(),
           name);
}

}  // namespace

HfCheckpoint HfCheckpoint::open(const std::string& dir) {
  HfCheckpoint ckpt;
  ckpt.dir_ = dir;
  fs::path root(dir);
  std::error_code ec;
  DI_CHECK(fs::is_directory(root, ec), "checkpoint folder '{}' does not exist or is not a folder", dir);
  ckpt.config_ = read_json(root / "config.json");
  DI_CHECK(ckpt.config_.is_object(), "{}: not a JSON object", (root / "config.json").string());

  fs::path index_path = root / kIndexFile;
  if (fs::exists(index_path, ec)) {
    json index = read_json(index_path);
    auto map = index.is_object() ? index.find("weight_map") : index.end();
    DI_CHECK(index.is_object() && map != index.end() && map->is_object(), "{}: no weight_map object",
             index_path.string());
    std::map<std::string, size_t> file_ids;
    for (auto& [tensor, shard] : map->items()) {
      DI_CHECK(shard.is_string(), "{}: weight_map entry '{}' is not a file name", index_path.string(), tensor);
      const auto& shard_name = shard.get_ref<const std::string&>();
      check_shard_name(shard_name, index_path);
      auto [it, inserted] = file_ids.emplace(shard_name, ckpt.files_.size());
      if (inserted) ckpt.files_.push_back(SafetensorsFile::open((root / shard_name).string()));
      const SafetensorsTensorInfo* info = ckpt.files_[it->second].find_tensor(tensor);
      DI_CHECK(info != nullptr, "{}: tensor '{}' is not in {}", index_path.string(), tensor, shard_name);
      ckpt.add(tensor, it->second, info);
    }
  } else {
    std::vector<fs::path> shards;
    for (const auto& e : fs::directory_iterator(root)) {
      if (e.is_regular_file() && e.path().extension() == ".safetensors") shards.push_back(e.path());
    }
    DI_CHECK(!shards.empty(), "checkpoint folder '{}' has no .safetensors files", dir);
    std::sort(shards.begin(), shards.end());
    for (const fs::path& p : shards) {
      ckpt.files_.push_back(SafetensorsFile::open(p.string()));
      size_t id = ckpt.files_.size() - 1;
      for (const SafetensorsTensorInfo& t : ckpt.files_.back().tensors()) ckpt.add(t.name, id, &t);
    }
  }
  for (const auto& [name, entry] : ckpt.entries_) ckpt.names_.push_back(name);
  return ckpt;
}

void HfCheckpoint::add(std::string name, size_t file, const SafetensorsTensorInfo* info) {
  auto [it, inserted] = entries_.emplace(std::move(name), Entry{file, info});
  DI_CHECK(inserted, "checkpoint '{}': tensor '{}' is defined in both {} and {}", dir_, it->first,
           files_[it->second.file].path(), files_[file].path());
}

const SafetensorsTensorInfo* HfCheckpoint::find_tensor(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.info;
}

Tensor HfCheckpoint::tensor(std::string_view name) const {
  auto it = entries_.find(name);
  DI_CHECK(it != entries_.end(), "checkpoint '{}' has no tensor '{}'", dir_, name);
  return files_[it->second.file].tensor(*it->second.info);
}

}  // namespace deepinfer
