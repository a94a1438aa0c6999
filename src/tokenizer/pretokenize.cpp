// Pre-tokenization: cutting normalized text into the pieces BPE merges within, with
// Hugging Face's Split and ByteLevel pre-tokenizers. HF compiles Split patterns with
// Oniguruma; we use PCRE2 (UTF + UCP, JIT) after rewriting the escapes whose meaning
// differs between the two (\s, \S, \w, \W, \h, \H), and widening \p{L} and \p{N} by the
// letters and numbers PCRE2's older Unicode tables lack, so both engines see the same classes.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "tokenizer/internal.h"
#include "util/util.h"

namespace kvaudit::tokenizer::detail {

const char* const kGpt2SplitPattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string oniguruma_to_pcre2(std::string_view pattern, std::string_view where) {
  const std::string white_space = kWhiteSpaceClassItems;
  // Oniguruma's Unicode \w is Letter | Mark | Decimal_Number | Connector_Punctuation; PCRE2's
  // (10.42) is \p{L} | \p{N} | '_'. Its \h is a hexadecimal digit, PCRE2's horizontal space.
  const std::string word =
      "\\p{L}" + extra_letter_class_items() + "\\p{M}\\p{Nd}\\p{Pc}" + extra_number_class_items();
  const std::string hex = "0-9a-fA-F";
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  auto unsupported = [&](std::string_view what) {
    return InputError(
        std::string(where),
        fmt::format("pre-tokenizer regex uses {}, which kvaudit does not support", what));
  };
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && (pattern.substr(i, 5) == "\\p{L}" || pattern.substr(i, 5) == "\\p{N}")) {
      const std::string& extra =
          pattern[i + 3] == 'L' ? extra_letter_class_items() : extra_number_class_items();
      if (!in_class) out += '[';
      out.append(pattern.substr(i, 5));
      out += extra;
      if (!in_class) out += ']';
      i += 4;
      continue;
    }
    if (c == '\\') {
      if (i + 1 >= pattern.size()) throw unsupported("a trailing backslash");
      char escaped = pattern[++i];
      const std::string* items = nullptr;
      bool negated = escaped == 'S' || escaped == 'W' || escaped == 'H';
      switch (escaped) {
        case 's':
        case 'S':
          items = &white_space;
          break;
        case 'w':
        case 'W':
          items = &word;
          break;
        case 'h':
        case 'H':
          items = &hex;
          break;
        default:
          break;
      }
      if (items == nullptr) {
        out += c;
        out += escaped;
      } else if (in_class) {
        if (negated) throw unsupported(fmt::format("\\{} inside a character class", escaped));
        out += *items;
      } else {
        out += negated ? "[^" : "[";
        out += *items;
        out += ']';
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // literal ]
      continue;
    }
    if (in_class && c == '[') {
      if (i + 1 < pattern.size() && pattern[i + 1] == ':') {  // POSIX class [:alpha:]
        size_t close = pattern.find(":]", i + 2);
        if (close == std::string_view::npos) throw unsupported("an unterminated POSIX class");
        out.append(pattern.substr(i, close + 2 - i));
        i = close + 1;
        continue;
      }
      throw unsupported("a nested character class");
    }
    if (in_class && c == '&' && i + 1 < pattern.size() && pattern[i + 1] == '&') {
      throw unsupported("character class intersection (&&)");
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view pattern, bool literal, std::string_view where) {
  std::string translated = literal ? std::string(pattern) : oniguruma_to_pcre2(pattern, where);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2 refuses UCP together with LITERAL; a literal needs no character classes anyway.
  uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    throw InputError(std::string(where),
                     fmt::format("pre-tokenizer regex does not compile at offset {}: {}",
                                 error_offset, reinterpret_cast<const char*>(message)));
  }
  // Without JIT (an exotic build) PCRE2 falls back to its interpreter: slower, same result.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_ = code;
}

Regex::Regex(Regex&& other) noexcept : code_(std::exchange(other.code_, nullptr)) {}

Regex& Regex::operator=(Regex&& other) noexcept {
  if (this != &other) {
    pcre2_code_free(static_cast<pcre2_code*>(code_));
    code_ = std::exchange(other.code_, nullptr);
  }
  return *this;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

namespace {

// A larger JIT stack for the rare subject that exhausts PCRE2's default 32 KiB one; one per
// thread, made on first need.
pcre2_match_context* large_stack_context() {
  struct Holder {
    pcre2_match_context* context = nullptr;
    pcre2_jit_stack* stack = nullptr;
    Holder() {
      context = pcre2_match_context_create(nullptr);
      stack = pcre2_jit_stack_create(64 << 10, 64 << 20, nullptr);
      if (context != nullptr && stack != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
    }
    ~Holder() {
      pcre2_jit_stack_free(stack);
      pcre2_match_context_free(context);
    }
  };
  thread_local Holder holder;
  return holder.stack != nullptr ? holder.context : nullptr;
}

}  // namespace

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  auto* code = static_cast<pcre2_code*>(code_);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match_data(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  if (!match_data) throw std::bad_alloc();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  pcre2_match_context* context = nullptr;
  size_t offset = 0;
  while (offset < text.size()) {
    // The text was made valid UTF-8 up front: skipping PCRE2's check keeps this loop linear.
    int rc = pcre2_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, match_data.get(),
                         context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      if (context == nullptr && (context = large_stack_context()) != nullptr) continue;
      // Out of resources even with the large stack: the rest stays one unsplit piece rather
      // than failing the whole encode. No pattern in a shipped tokenizer gets here.
      break;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
    size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      offset = end;
    } else {
      // Empty match: HF drops empty pieces; step over one code point and search on.
      offset = begin + 1;
      while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) {
        ++offset;
      }
    }
  }
}

namespace {

// tokenizers' SplitDelimiterBehavior applied to the spans (begin, end, is_match) that cover
// a piece, appending the resulting non-empty pieces.
void split_piece(std::string_view piece, const PreTokenizerStep& step,
                 std::vector<std::pair<size_t, size_t>>& matches,
                 std::vector<std::string_view>& out) {
  matches.clear();
  step.regex->find_all(piece, matches);
  struct Span {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  size_t previous_end = 0;
  for (auto [begin, end] : matches) {
    if (begin > previous_end) spans.push_back({previous_end, begin, step.invert});
    spans.push_back({begin, end, !step.invert});
    previous_end = end;
  }
  if (previous_end < piece.size()) spans.push_back({previous_end, piece.size(), step.invert});

  std::vector<Span> merged;
  switch (step.behavior) {
    case SplitBehavior::isolated:
      merged = std::move(spans);
      break;
    case SplitBehavior::removed:
      for (const Span& span : spans) {
        if (!span.is_match) merged.push_back(span);
      }
      break;
    case SplitBehavior::merged_with_previous: {
      bool previous_match = false;
      for (const Span& span : spans) {
        if (span.is_match && !previous_match && !merged.empty()) {
          merged.back().end = span.end;
        } else {
          merged.push_back(span);
        }
        previous_match = span.is_match;
      }
      break;
    }
    case SplitBehavior::merged_with_next: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case SplitBehavior::contiguous: {
      bool previous_match = false;
      for (const Span& span : spans) {
        if (span.is_match == previous_match && !merged.empty()) {
          merged.back().end = span.end;
        } else {
          merged.push_back(span);
        }
        previous_match = span.is_match;
      }
      break;
    }
  }
  for (const Span& span : merged) {
    if (span.end > span.begin) out.push_back(piece.substr(span.begin, span.end - span.begin));
  }
}

}  // namespace

void PreTokenizer::run(std::string_view text, std::vector<std::string_view>& pieces,
                       std::deque<std::string>& storage) const {
  pieces.clear();
  if (text.empty()) return;
  pieces.push_back(text);
  std::vector<std::string_view> next;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const PreTokenizerStep& step : steps) {
    if (step.kind == PreTokenizerStep::Kind::byte_level && !step.add_prefix_space && !step.regex) {
      continue;  // the byte-to-character mapping itself is implicit: BPE works on bytes
    }
    next.clear();
    for (std::string_view piece : pieces) {
      if (step.kind == PreTokenizerStep::Kind::byte_level && step.add_prefix_space &&
          piece.front() != ' ') {
        std::string& prefixed = storage.emplace_back();
        prefixed.reserve(piece.size() + 1);
        prefixed.push_back(' ');
        prefixed.append(piece);
        piece = prefixed;
      }
      if (step.regex) {
        split_piece(piece, step, matches, next);
      } else {
        next.push_back(piece);
      }
    }
    pieces.swap(next);
  }
}

}  // namespace kvaudit::tokenizer::detail
