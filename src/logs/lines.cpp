// logs lines: removes what wraps an engine's message: CR, ANSI colour codes, the
// journalctl prefix (`Mar 07 14:14:22 host unit[pid]: `, or short-iso), a docker
// compose prefix (`svc-1  | `), vLLM process prefixes (`(EngineCore_DP0 pid=7) `,
// `(VllmWorker rank=1 pid=9) `, `[rank0]: `), vLLM level prefixes
// (`INFO 04-29 01:07:40 [loader.py:458] `) and SGLang's `[2026-02-27 17:10:27 TP0] `.
#include <cctype>
#include <cstring>

#include "logs/logs.h"

namespace kvaudit::logs {

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

std::string strip_ansi(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\x1b') {
      out += text[i];
      continue;
    }
    // ESC [ params letter  (CSI), or ESC followed by one character.
    if (i + 1 < text.size() && text[i + 1] == '[') {
      size_t j = i + 2;
      while (j < text.size() && !(text[j] >= '@' && text[j] <= '~')) ++j;
      i = j;
    } else {
      ++i;
    }
  }
  return out;
}

// "Mar 07 14:14:22 host ident[pid]: " -> length of the prefix, or 0.
size_t journal_prefix(std::string_view s, std::string& timestamp, std::string& ident) {
  static const char* kMonths = "JanFebMarAprMayJunJulAugSepOctNovDec";
  size_t rest = 0;
  if (s.size() > 16 && s[3] == ' ' && s[6] == ' ' && s[9] == ':' && s[12] == ':' && s[15] == ' ' &&
      std::strstr(kMonths, std::string(s.substr(0, 3)).c_str()) != nullptr && (is_digit(s[5])) &&
      is_digit(s[7]) && is_digit(s[8])) {
    timestamp = std::string(s.substr(0, 15));
    rest = 16;
  } else if (s.size() > 20 && is_digit(s[0]) && is_digit(s[3]) && s[4] == '-' && s[7] == '-' &&
             s[10] == 'T' && s[13] == ':' && s[16] == ':') {
    size_t space = s.find(' ');
    if (space == std::string_view::npos || space > 40) return 0;
    timestamp = std::string(s.substr(0, space));
    rest = space + 1;
  } else {
    return 0;
  }
  // host
  size_t host_end = s.find(' ', rest);
  if (host_end == std::string_view::npos) return 0;
  // ident[pid]:
  size_t colon = s.find(": ", host_end + 1);
  size_t space = s.find(' ', host_end + 1);
  if (colon == std::string_view::npos || (space != std::string_view::npos && space < colon))
    return 0;
  std::string_view id = s.substr(host_end + 1, colon - host_end - 1);
  size_t bracket = id.find('[');
  ident = std::string(id.substr(0, bracket));
  return colon + 2;
}

// Newer vLLM names its processes by rank: "Worker_TP3", "Worker_PP1_TP3",
// "EngineCore_DP1", "Worker_DP0_TP1_EP1". Kept as SGLang writes ranks: "DP0 TP1".
std::string process_rank(std::string_view inside) {
  std::string out;
  for (size_t i = 0; i + 2 < inside.size(); ++i) {
    const bool boundary = i == 0 || inside[i - 1] == '_' || inside[i - 1] == ' ';
    std::string_view two = inside.substr(i, 2);
    if (!boundary || !(two == "DP" || two == "PP" || two == "TP") || !is_digit(inside[i + 2]))
      continue;
    size_t j = i + 2;
    while (j < inside.size() && is_digit(inside[j]) && j - i < 8) ++j;
    if (j < inside.size() && inside[j] != '_' && inside[j] != ' ') continue;
    if (!out.empty()) out += ' ';
    out += std::string(inside.substr(i, j - i));
    i = j - 1;
  }
  return out;
}

}  // namespace

LogLine normalise_line(std::string_view raw) {
  LogLine line;
  while (!raw.empty() && (raw.back() == '\r' || raw.back() == '\n')) raw.remove_suffix(1);
  std::string text =
      raw.find('\x1b') != std::string_view::npos ? strip_ansi(raw) : std::string(raw);
  std::string_view s = text;

  // A coloured terminal pasted as HTML: "<font color=...><b>(VllmWorker TP0 pid=1)</b></font> ".
  if (text.rfind("<font", 0) == 0) {
    std::string plain;
    size_t i = 0;
    for (; i < text.size() && i < 256; ++i) {
      if (text[i] == '<') {
        size_t close = text.find('>', i);
        if (close == std::string::npos) break;
        i = close;
      } else {
        plain += text[i];
      }
    }
    text = plain + text.substr(std::min(i, text.size()));
    s = text;
  }

  std::string journal_time;
  size_t cut = journal_prefix(s, journal_time, line.journal_ident);
  s.remove_prefix(cut);
  // Python logging around the engine's line: "2025-03-07 23:50:27,531 - __main__ - INFO - ".
  if (s.size() > 30 && is_digit(s[0]) && s[4] == '-' && s[10] == ' ' && s[13] == ':' &&
      s[19] == ',' && s.substr(23, 3) == " - ") {
    size_t level = s.find(" - ", 26);
    size_t rest = level == std::string_view::npos ? level : s.find(" - ", level + 3);
    if (rest != std::string_view::npos && rest < 120) {
      if (journal_time.empty()) journal_time = std::string(s.substr(0, 19));
      s.remove_prefix(rest + 3);
    }
  }

  // docker compose: "service-1  | message"
  size_t bar = s.find(" | ");
  if (bar != std::string_view::npos && bar > 0 && bar < 64) {
    std::string_view name = s.substr(0, bar);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (!name.empty() && name.find(' ') == std::string_view::npos &&
        name.find('[') == std::string_view::npos)
      s.remove_prefix(bar + 3);
  }
  // vLLM process prefix: "(EngineCore_DP0 pid=15098) " / "(VllmWorker rank=0 pid=105) "
  if (!s.empty() && s[0] == '(') {
    size_t close = s.find(") ");
    if (close != std::string_view::npos && close < 80 &&
        s.substr(0, close).find("pid=") != std::string_view::npos) {
      std::string_view inside = s.substr(1, close - 1);
      size_t r = inside.find("rank=");
      if (r != std::string_view::npos) {
        size_t e = inside.find(' ', r);
        line.rank = std::string(
            inside.substr(r, e == std::string_view::npos ? std::string_view::npos : e - r));
      } else {
        line.rank = process_rank(inside);
      }
      s.remove_prefix(close + 2);
    }
  }
  // torch distributed: "[rank0]: "
  if (s.rfind("[rank", 0) == 0) {
    size_t close = s.find("]: ");
    if (close != std::string_view::npos && close < 12) {
      line.rank = "rank=" + std::string(s.substr(5, close - 5));
      s.remove_prefix(close + 3);
    }
  }
  std::string engine_time;
  // vLLM level prefix: "INFO 04-29 01:07:40 [loader.py:458] " or "INFO 01-30 03:18:12 file.py:848]
  // "
  static const char* kLevels[] = {"INFO ", "WARNING ", "ERROR ", "DEBUG ", "CRITICAL "};
  for (const char* level : kLevels) {
    size_t n = std::strlen(level);
    if (s.size() > n + 15 && s.compare(0, n, level) == 0 && is_digit(s[n]) && s[n + 2] == '-' &&
        s[n + 5] == ' ' && s[n + 8] == ':') {
      engine_time = std::string(s.substr(n, 14));
      size_t close = s.find("] ", n + 14);
      if (close != std::string_view::npos && close < n + 120)
        s.remove_prefix(close + 2);
      else
        s.remove_prefix(n + 15);
      break;
    }
  }
  // SGLang: "[2026-02-27 17:10:27 TP0] " / "[2026-02-27 17:10:27] " / "[2026-02-27 17:10:27 DP0
  // TP3] "
  if (s.size() > 21 && s[0] == '[' && is_digit(s[1]) && s[5] == '-' && s[11] == ' ' &&
      s[14] == ':') {
    size_t close = s.find("] ");
    if (close != std::string_view::npos && close < 64) {
      engine_time = std::string(s.substr(1, 19));
      if (close > 21) line.rank = std::string(s.substr(21, close - 21));
      s.remove_prefix(close + 2);
    }
  }
  line.timestamp = !journal_time.empty() ? journal_time : engine_time;
  line.message = std::string(s);
  return line;
}

}  // namespace kvaudit::logs
