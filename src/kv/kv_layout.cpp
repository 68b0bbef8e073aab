#include "kv/kv_layout.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer {

KvLayout KvLayout::from_windows(std::span<const int32_t> layer_window) {
  DI_CHECK(!layer_window.empty(), "KV layout: the model has no layers");
  struct Kind {
    int32_t window;
    std::vector<int32_t> layers;
  };
  std::vector<Kind> kinds;
  for (int32_t l = 0; l < static_cast<int32_t>(layer_window.size()); ++l) {
    const int32_t w = layer_window[static_cast<size_t>(l)];
    DI_CHECK(w >= 0, "KV layout: layer {} has a negative window {}", l, w);
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const Kind& k) { return k.window == w; });
    if (it == kinds.end()) it = kinds.insert(kinds.end(), Kind{w, {}});
    it->layers.push_back(l);
  }
  KvLayout out;
  out.slots_per_block = static_cast<int32_t>(
      std::min_element(kinds.begin(), kinds.end(), [](const Kind& a, const Kind& b) {
        return a.layers.size() < b.layers.size();
      })->layers.size());
  out.group_of_layer.assign(layer_window.size(), -1);
  out.slot_of_layer.assign(layer_window.size(), -1);
  for (const Kind& k : kinds) {
    for (size_t first = 0; first < k.layers.size(); first += static_cast<size_t>(out.slots_per_block)) {
      KvGroup g;
      g.window = k.window;
      const size_t last = std::min(k.layers.size(), first + static_cast<size_t>(out.slots_per_block));
      g.layers.assign(k.layers.begin() + static_cast<ptrdiff_t>(first),
                      k.layers.begin() + static_cast<ptrdiff_t>(last));
      for (size_t s = 0; s < g.layers.size(); ++s) {
        out.group_of_layer[static_cast<size_t>(g.layers[s])] = out.num_groups();
        out.slot_of_layer[static_cast<size_t>(g.layers[s])] = static_cast<int32_t>(s);
      }
      out.groups.push_back(std::move(g));
    }
  }
  return out;
}

KvLayout KvLayout::single(int32_t n_layers) {
  DI_CHECK(n_layers > 0, "KV layout: the model has no layers");
  KvLayout out;
  out.slots_per_block = n_layers;
  KvGroup g;
  for (int32_t l = 0; l < n_layers; ++l) {
    g.layers.push_back(l);
    out.group_of_layer.push_back(0);
    out.slot_of_layer.push_back(l);
  }
  out.groups.push_back(std::move(g));
  return out;
}

}  // namespace deepinfer
