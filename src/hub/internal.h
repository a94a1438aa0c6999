// hub internals: the references' and caches' helpers hub.cpp and fetch.cpp share. Private to
// src/hub/.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hub/hub.h"

namespace kvaudit::hub {

// A full commit sha: 40 lowercase hex digits.
bool is_commit_sha(std::string_view text);
// A revision in a URL path: "refs/pr/4" -> "refs%2Fpr%2F4" (the hub's own encoding).
std::string encode_revision(std::string_view revision);
// `text` without the blanks around it.
std::string trimmed(std::string text);

// kvaudit's cache: --cache-dir, else KVAUDIT_CACHE_DIR, else the XDG cache's kvaudit/hub.
std::filesystem::path kvaudit_cache_root(const HubOptions& options);
// The Hugging Face cache's folder name for a model repository (kvaudit's cache uses it too).
std::string repo_folder(const std::string& repo);
// The shard names an index's weight_map lists, with the tensors of each (checkpoint's reader
// of the index, so a remote audit refuses what a local one refuses).
std::map<std::string, std::vector<std::string>> index_shards(const std::string& text,
                                                             const std::string& where);
// The user's Hugging Face cache snapshot of this revision, when it holds every file an
// audit reads (a partial snapshot is not used: it would make a partial audit); sets `sha`
// to its commit, and adds to `notes` why a snapshot was passed over.
std::optional<std::filesystem::path> hf_cache_snapshot(const HubRef& ref, const HubOptions& options,
                                                       std::string& sha,
                                                       std::vector<std::string>& notes);

}  // namespace kvaudit::hub
