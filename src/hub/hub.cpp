// hub: references, the endpoint and token conventions, the two caches (kvaudit's and the
// user's Hugging Face cache), and a fetched checkpoint read as the repository. The remote
// fetch that lays out sparse stand-in shards is in fetch.cpp.
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <set>

#include "hub/internal.h"
#include "util/json.h"
#include "util/util.h"

namespace kvaudit::hub {

namespace fs = std::filesystem;

// ---------------------------------------------------------------- references

namespace {

bool valid_name_part(std::string_view part) {
  if (part.empty() || part.size() > 96 || part == "." || part == "..") return false;
  if (!std::isalnum(static_cast<unsigned char>(part[0]))) return false;
  return std::all_of(part.begin(), part.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

fs::path home() {
  std::string h = env("HOME");
  return h.empty() ? fs::path("/tmp") : fs::path(h);
}

fs::path hf_home() {
  std::string h = env("HF_HOME");
  if (!h.empty()) return h;
  std::string xdg = env("XDG_CACHE_HOME");
  return (xdg.empty() ? home() / ".cache" : fs::path(xdg)) / "huggingface";
}

}  // namespace

bool is_commit_sha(std::string_view text) {
  return text.size() == 40 && std::all_of(text.begin(), text.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
         });
}

// A revision in a URL path: "refs/pr/4" -> "refs%2Fpr%2F4" (the hub's own encoding).
std::string encode_revision(std::string_view revision) {
  std::string out;
  for (char c : revision) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')
      out += c;
    else
      out += fmt::format("%{:02X}", static_cast<unsigned char>(c));
  }
  return out;
}

std::string trimmed(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  return text.substr(start);
}
std::string HubRef::text() const {
  return revision.empty() || revision == "main" ? repo : repo + "@" + revision;
}

std::optional<HubRef> parse_hub_ref(std::string_view text) {
  if (text.rfind("hf://", 0) == 0) text.remove_prefix(5);
  HubRef ref;
  ref.revision = "main";
  if (size_t at = text.find('@'); at != std::string_view::npos) {
    ref.revision = std::string(text.substr(at + 1));
    text = text.substr(0, at);
    if (ref.revision.empty() || ref.revision.size() > 256) return std::nullopt;
    for (char c : ref.revision)
      if (static_cast<unsigned char>(c) < 0x21) return std::nullopt;
  }
  size_t slash = text.find('/');
  if (slash == std::string_view::npos || text.find('/', slash + 1) != std::string_view::npos)
    return std::nullopt;
  if (!valid_name_part(text.substr(0, slash)) || !valid_name_part(text.substr(slash + 1)))
    return std::nullopt;
  ref.repo = std::string(text);
  return ref;
}

std::string resolve_endpoint(const std::string& flag) {
  std::string endpoint = !flag.empty() ? flag : env("HF_ENDPOINT");
  if (endpoint.empty()) endpoint = "https://huggingface.co";
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return endpoint;
}

std::string resolve_token(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (std::string token = env("HF_TOKEN"); !token.empty()) return token;
  std::vector<fs::path> files;
  if (std::string path = env("HF_TOKEN_PATH"); !path.empty()) files.push_back(path);
  files.push_back(hf_home() / "token");
  for (const fs::path& file : files) {
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) continue;
    try {
      if (std::string token = trimmed(read_text_file(file, 4096)); !token.empty()) return token;
    } catch (const InputError&) {
    }
  }
  return "";
}

// ---------------------------------------------------------------- caches

namespace {

fs::path hf_cache_root(const HubOptions& options) {
  if (!options.hf_cache.empty()) return options.hf_cache;
  if (std::string dir = env("HF_HUB_CACHE"); !dir.empty()) return fs::path(dir);
  return hf_home() / "hub";
}

}  // namespace

fs::path kvaudit_cache_root(const HubOptions& options) {
  if (!options.cache_dir.empty()) return options.cache_dir;
  if (std::string dir = env("KVAUDIT_CACHE_DIR"); !dir.empty()) return fs::path(dir);
  std::string xdg = env("XDG_CACHE_HOME");
  return (xdg.empty() ? home() / ".cache" : fs::path(xdg)) / "kvaudit" / "hub";
}

// The Hugging Face cache's folder name for a model repository (kvaudit's cache uses it too).
std::string repo_folder(const std::string& repo) {
  return "models--" + repo.substr(0, repo.find('/')) + "--" + repo.substr(repo.find('/') + 1);
}

// The shard names an index's weight_map lists, with the tensors of each (checkpoint's reader
// of the index, so a remote audit refuses what a local one refuses).
std::map<std::string, std::vector<std::string>> index_shards(const std::string& text,
                                                             const std::string& where) {
  std::map<std::string, std::vector<std::string>> shards;
  checkpoint::read_safetensors_index(text, where,
                                     [&](std::string_view tensor, std::string_view shard) {
                                       shards[std::string(shard)].emplace_back(tensor);
                                     });
  return shards;
}

// The user's Hugging Face cache snapshot of this revision, when it holds every file an
// audit reads (a partial snapshot is not used: it would make a partial audit).
std::optional<fs::path> hf_cache_snapshot(const HubRef& ref, const HubOptions& options,
                                          std::string& sha, std::vector<std::string>& notes) {
  const fs::path repo = hf_cache_root(options) / repo_folder(ref.repo);
  std::error_code ec;
  if (!fs::is_directory(repo, ec)) return std::nullopt;
  std::string commit = ref.revision;
  if (!is_commit_sha(commit)) {
    const fs::path refs = repo / "refs" / ref.revision;
    if (!fs::is_regular_file(refs, ec)) return std::nullopt;
    try {
      commit = trimmed(read_text_file(refs, 256));
    } catch (const InputError&) {
      return std::nullopt;
    }
    if (!is_commit_sha(commit)) return std::nullopt;
  }
  const fs::path snapshot = repo / "snapshots" / commit;
  if (!fs::exists(snapshot / "config.json", ec)) return std::nullopt;
  std::vector<std::string> missing;
  if (fs::exists(snapshot / "model.safetensors.index.json", ec)) {
    try {
      const fs::path index = snapshot / "model.safetensors.index.json";
      for (const auto& [shard, tensors] :
           index_shards(read_text_file(index, options.max_index_bytes), index.string()))
        if (!fs::exists(snapshot / shard, ec)) missing.push_back(shard);
    } catch (const InputError& error) {
      notes.push_back(fmt::format("Hugging Face cache snapshot {} not used: {}", snapshot.string(),
                                  error.what()));
      return std::nullopt;
    }
  } else if (!fs::exists(snapshot / "model.safetensors", ec)) {
    missing.push_back("model.safetensors");
  }
  if (!missing.empty()) {
    notes.push_back(
        fmt::format("Hugging Face cache snapshot {} lacks {} shard(s) (e.g. {}): read "
                    "from the hub instead",
                    snapshot.string(), missing.size(), missing.front()));
    return std::nullopt;
  }
  sha = commit;
  return snapshot;
}

checkpoint::ModelFacts read_hub_checkpoint(const HubCheckpoint& hub,
                                           const checkpoint::ReadOptions& options) {
  checkpoint::ModelFacts facts = checkpoint::read_checkpoint(hub.dir, options);
  // Name files by the repository, not by where the cache happens to live.
  const std::string local = hub.dir.string();
  auto relabel = [&](std::string& text) {
    if (text.rfind(local, 0) == 0) text = hub.label + text.substr(local.size());
  };
  relabel(facts.config_file);
  if (facts.quant) {
    relabel(facts.quant->source_file);
    relabel(facts.quant->other_source_file);
  }
  facts.source = hub.source;
  facts.dir = hub.label;  // reports name the repository; files_dir stays where they are
  for (const auto& note : hub.notes) facts.notes.push_back(note);
  return facts;
}

}  // namespace kvaudit::hub
