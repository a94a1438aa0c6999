// report/svg: draws one Chart as an inline SVG element for the HTML report:
// grouped bars, lines over a linear or log axis, and heatmaps with a sequential
// or diverging colour scale. Text and axes use currentColor so the page's light,
// dark and print styles apply; series colours are the Okabe-Ito palette (safe
// for colour-blind readers) plus a dash pattern per series for grey print-outs.
// Every mark carries data-* attributes naming its chart, series and values.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "report/report.h"
#include "util/util.h"

namespace kvaudit::report {
namespace {

constexpr double kWidth = 760;
constexpr double kHeight = 380;
constexpr std::array<const char*, 8> kPalette = {"#0072b2", "#e69f00", "#009e73", "#d55e00",
                                                 "#cc79a7", "#56b4e9", "#8c6d1f", "#7f7f7f"};
constexpr std::array<const char*, 4> kDashes = {"", "7 3", "2 3", "9 3 2 3"};

std::string number_attribute(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{}", value);
}

std::string shown_value(double value, const Chart& chart) {
  Column column;
  column.precision = chart.precision;
  std::string text = format_value(Value{value}, column);
  if (!chart.value_unit.empty()) text += (chart.value_unit == "%" ? "" : " ") + chart.value_unit;
  return text;
}

// Short tick labels: 2048 -> "2K", 131072 -> "128K" (token counts are binary
// multiples), 1500000 -> "1.5M", 0.25 -> "0.25".
std::string tick_label(double value) {
  double magnitude = std::fabs(value);
  bool integral = std::floor(value) == value;
  if (integral && magnitude >= 1048576 && std::fmod(magnitude, 1048576) == 0) {
    return fmt::format("{:g}M", value / 1048576);
  }
  if (integral && magnitude >= 1024 && std::fmod(magnitude, 1024) == 0) {
    return fmt::format("{:g}K", value / 1024);
  }
  if (magnitude >= 1e9) return fmt::format("{:.3g}G", value / 1e9);
  if (magnitude >= 1e6) return fmt::format("{:.3g}M", value / 1e6);
  if (magnitude >= 1e4) return fmt::format("{:.3g}K", value / 1e3);
  return fmt::format("{:.4g}", value);
}

// A numeric axis mapping data values onto [pixel_lo, pixel_hi].
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double pixel_lo = 0, pixel_hi = 1;
  std::vector<double> ticks;

  bool shows(double value) const { return std::isfinite(value) && (!log || value > 0); }
  double pixel(double value) const {
    double a = log ? std::log10(lo) : lo;
    double b = log ? std::log10(hi) : hi;
    double v = log ? std::log10(value) : value;
    double t = b > a ? (v - a) / (b - a) : 0.5;
    return pixel_lo + t * (pixel_hi - pixel_lo);
  }
};

Axis make_axis(std::vector<double> values, bool log, bool include_zero, bool ticks_at_values) {
  Axis axis;
  axis.log = log;
  std::erase_if(values, [&](double v) { return !std::isfinite(v) || (log && v <= 0); });
  if (values.empty()) values = log ? std::vector<double>{1, 10} : std::vector<double>{0, 1};
  auto [min_it, max_it] = std::minmax_element(values.begin(), values.end());
  double lo = *min_it, hi = *max_it;
  if (log) {
    double decade_lo = std::floor(std::log10(lo));
    double decade_hi = std::ceil(std::log10(hi));
    if (decade_hi <= decade_lo) decade_hi = decade_lo + 1;
    if (ticks_at_values) {
      std::sort(values.begin(), values.end());
      values.erase(std::unique(values.begin(), values.end()), values.end());
      axis.lo = lo / 1.15;
      axis.hi = hi * 1.15;
      if (axis.lo == axis.hi) axis.hi = axis.lo * 10;
      axis.ticks = values;
      return axis;
    }
    axis.lo = std::pow(10.0, decade_lo);
    axis.hi = std::pow(10.0, decade_hi);
    for (double d = decade_lo; d <= decade_hi; ++d) {
      double base = std::pow(10.0, d);
      axis.ticks.push_back(base);
      if (decade_hi - decade_lo <= 2 && d < decade_hi) {
        axis.ticks.push_back(2 * base);
        axis.ticks.push_back(5 * base);
      }
    }
    return axis;
  }
  if (include_zero) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
  }
  if (hi == lo) {
    hi = lo + (lo == 0 ? 1 : std::fabs(lo) * 0.5);
    if (!include_zero) lo -= (hi - lo);
  }
  // A "nice" step (1, 2 or 5 times a power of ten) giving about five intervals.
  double raw_step = (hi - lo) / 5;
  double power = std::pow(10.0, std::floor(std::log10(raw_step)));
  double step = power;
  for (double multiple : {1.0, 2.0, 5.0, 10.0}) {
    step = multiple * power;
    if (step >= raw_step) break;
  }
  axis.lo = std::floor(lo / step + 1e-9) * step;
  axis.hi = std::ceil(hi / step - 1e-9) * step;
  for (int i = 0;; ++i) {
    double tick = axis.lo + i * step;
    if (tick > axis.hi + step * 1e-6) break;
    axis.ticks.push_back(std::fabs(tick) < step * 1e-9 ? 0.0 : tick);
  }
  return axis;
}

struct Frame {
  double left = 76, top = 20, right = kWidth - 20, bottom = kHeight - 64;
};

std::string svg_open(const Chart& chart, double height) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"kv-chart kv-chart-{}\" "
      "data-chart-id=\"{}\" data-chart-kind=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" "
      "aria-label=\"{}\" font-family=\"system-ui, sans-serif\" font-size=\"12\">\n",
      chart.kind == ChartKind::bars    ? "bars"
      : chart.kind == ChartKind::lines ? "lines"
                                       : "heatmap",
      escape_html(chart.id),
      chart.kind == ChartKind::bars    ? "bars"
      : chart.kind == ChartKind::lines ? "lines"
                                       : "heatmap",
      kWidth, height, escape_html(chart.title.empty() ? chart.id : chart.title));
}

std::string y_axis(const Axis& axis, const Frame& frame, const std::string& label) {
  std::string out = "<g class=\"kv-axis kv-axis-y\">\n";
  for (double tick : axis.ticks) {
    double y = axis.pixel(tick);
    out += fmt::format(
        "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"currentColor\" "
        "stroke-opacity=\"0.15\"/><text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" "
        "fill=\"currentColor\" data-tick=\"{}\">{}</text>\n",
        frame.left, frame.right, y, y, frame.left - 6, y + 4, number_attribute(tick),
        escape_html(tick_label(tick)));
  }
  out += fmt::format(
      "<text transform=\"translate(16 {:.1f}) rotate(-90)\" text-anchor=\"middle\" "
      "fill=\"currentColor\" class=\"kv-axis-label\">{}</text>\n</g>\n",
      (frame.top + frame.bottom) / 2, escape_html(label));
  return out;
}

std::string x_axis_line(const Frame& frame, const std::string& label) {
  return fmt::format(
      "<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"currentColor\" "
      "stroke-opacity=\"0.6\"/>\n<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" "
      "fill=\"currentColor\" class=\"kv-axis-label\">{}</text>\n",
      frame.left, frame.right, frame.bottom, frame.bottom, (frame.left + frame.right) / 2,
      kHeight - 10, escape_html(label));
}

// Legend across the top right, one entry per series (skipped for one series).
// Says so in the plot area when no value can be drawn (all missing, or none
// positive on a log axis), rather than showing empty axes that look like zero.
std::string no_data_note(const std::vector<double>& values, const Axis& axis, const Frame& frame) {
  if (std::any_of(values.begin(), values.end(), [&](double v) { return axis.shows(v); })) return "";
  return fmt::format(
      "<text class=\"kv-no-data\" x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" "
      "fill=\"currentColor\" fill-opacity=\"0.6\">no data to draw</text>\n",
      (frame.left + frame.right) / 2, (frame.top + frame.bottom) / 2);
}

std::string legend(const Chart& chart, Frame& frame) {
  if (chart.series.size() < 2) return "";
  std::string out = "<g class=\"kv-legend\">\n";
  double x = frame.left, y = 14;
  for (size_t i = 0; i < chart.series.size(); ++i) {
    std::string name = escape_html(chart.series[i].name);
    double entry_width = 34 + 7.0 * static_cast<double>(display_width(chart.series[i].name));
    if (x + entry_width > kWidth - 10 && x > frame.left) {
      x = frame.left;
      y += 18;
    }
    out += fmt::format(
        "<g data-series=\"{}\"><line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"{}\" stroke-width=\"3\" stroke-dasharray=\"{}\"/><text x=\"{:.1f}\" "
        "y=\"{:.1f}\" fill=\"currentColor\">{}</text></g>\n",
        name, x, x + 22, y - 4, y - 4, kPalette[i % kPalette.size()],
        chart.kind == ChartKind::lines ? kDashes[i % kDashes.size()] : "", x + 27, y, name);
    x += entry_width + 12;
  }
  frame.top = y + 16;
  return out + "</g>\n";
}

std::string bars_chart(const Chart& chart) {
  Frame frame;
  std::string out = svg_open(chart, kHeight) + legend(chart, frame);
  std::vector<double> values;
  for (const Series& series : chart.series)
    values.insert(values.end(), series.y.begin(), series.y.end());
  Axis axis = make_axis(values, chart.log_y, true, false);
  axis.pixel_lo = frame.bottom;
  axis.pixel_hi = frame.top;
  out += y_axis(axis, frame, chart.y_label) + no_data_note(values, axis, frame);
  size_t groups = chart.x_categories.size();
  size_t per_group = std::max<size_t>(chart.series.size(), 1);
  double group_width =
      (frame.right - frame.left) / static_cast<double>(std::max<size_t>(groups, 1));
  double bar_width = std::min(56.0, group_width * 0.8 / static_cast<double>(per_group));
  double baseline = axis.log ? frame.bottom : axis.pixel(0);
  bool label_bars = groups * per_group <= 24;
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const Series& series = chart.series[s];
    out += fmt::format(
        "<g class=\"kv-series s{}\" data-series=\"{}\" data-series-index=\"{}\" fill=\"{}\">\n", s,
        escape_html(series.name), s, kPalette[s % kPalette.size()]);
    for (size_t g = 0; g < groups && g < series.y.size(); ++g) {
      double value = series.y[g];
      double center = frame.left + group_width * (static_cast<double>(g) + 0.5);
      double x = center - bar_width * static_cast<double>(per_group) / 2 +
                 bar_width * static_cast<double>(s);
      std::string title = escape_html(series.name + ", " + chart.x_categories[g] + ": " +
                                      shown_value(value, chart));
      if (!axis.shows(value)) {
        out += fmt::format(
            "<rect class=\"kv-missing\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"0\" "
            "data-x=\"{}\" data-y=\"{}\"><title>{}</title></rect>\n",
            x, baseline, bar_width - 2, escape_html(chart.x_categories[g]), number_attribute(value),
            title);
        continue;
      }
      double top = axis.pixel(value);
      out += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" data-x=\"{}\" "
          "data-y=\"{}\"><title>{}</title></rect>\n",
          x, std::min(top, baseline), bar_width - 2, std::fabs(baseline - top),
          escape_html(chart.x_categories[g]), number_attribute(value), title);
      if (label_bars) {
        out += fmt::format(
            "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"10\" "
            "fill=\"currentColor\">{}</text>\n",
            x + (bar_width - 2) / 2, std::min(top, baseline) - 4,
            escape_html(shown_value(value, chart)));
      }
    }
    out += "</g>\n";
  }
  size_t longest = 0;
  for (const std::string& category : chart.x_categories)
    longest = std::max(longest, display_width(category));
  bool rotate = static_cast<double>(longest) * 7 > group_width;
  out += "<g class=\"kv-axis kv-axis-x\">\n";
  for (size_t g = 0; g < groups; ++g) {
    double center = frame.left + group_width * (static_cast<double>(g) + 0.5);
    out += rotate ? fmt::format(
                        "<text transform=\"translate({:.1f} {:.1f}) rotate(-30)\" "
                        "text-anchor=\"end\" fill=\"currentColor\">{}</text>\n",
                        center, frame.bottom + 14, escape_html(chart.x_categories[g]))
                  : fmt::format(
                        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" "
                        "fill=\"currentColor\">{}</text>\n",
                        center, frame.bottom + 18, escape_html(chart.x_categories[g]));
  }
  out += x_axis_line(frame, chart.x_label) + "</g>\n";
  return out + "</svg>\n";
}

std::string lines_chart(const Chart& chart) {
  Frame frame;
  std::string out = svg_open(chart, kHeight) + legend(chart, frame);
  bool numeric_x = !chart.x_values.empty();
  size_t points = numeric_x ? chart.x_values.size() : chart.x_categories.size();
  std::vector<double> xs;
  for (size_t i = 0; i < points; ++i)
    xs.push_back(numeric_x ? chart.x_values[i] : static_cast<double>(i));
  std::vector<double> values;
  for (const Series& series : chart.series)
    values.insert(values.end(), series.y.begin(), series.y.end());
  Axis y_axis_scale = make_axis(values, chart.log_y, false, false);
  y_axis_scale.pixel_lo = frame.bottom;
  y_axis_scale.pixel_hi = frame.top;
  bool few_integer_x = numeric_x && points <= 10 && std::all_of(xs.begin(), xs.end(), [](double x) {
                         return x > 0 && std::floor(x) == x;
                       });
  Axis x_axis_scale = numeric_x ? make_axis(xs, chart.log_x, false, few_integer_x && chart.log_x)
                                : Axis{-0.5, static_cast<double>(points) - 0.5, false, 0, 1, {}};
  x_axis_scale.pixel_lo = frame.left;
  x_axis_scale.pixel_hi = frame.right;
  if (!numeric_x) x_axis_scale.ticks = xs;
  out += y_axis(y_axis_scale, frame, chart.y_label) + no_data_note(values, y_axis_scale, frame);
  out += "<g class=\"kv-axis kv-axis-x\">\n";
  for (size_t t = 0; t < x_axis_scale.ticks.size(); ++t) {
    double tick = x_axis_scale.ticks[t];
    std::string label = numeric_x ? tick_label(tick) : chart.x_categories[t];
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"currentColor\" "
        "data-tick=\"{}\">{}</text>\n",
        x_axis_scale.pixel(tick), frame.bottom + 18, number_attribute(tick), escape_html(label));
  }
  out += x_axis_line(frame, chart.x_label) + "</g>\n";
  for (size_t s = 0; s < chart.series.size(); ++s) {
    const Series& series = chart.series[s];
    const char* color = kPalette[s % kPalette.size()];
    std::string path, marks;
    bool pen_down = false;
    for (size_t i = 0; i < points && i < series.y.size(); ++i) {
      double value = series.y[i];
      if (!y_axis_scale.shows(value) || !x_axis_scale.shows(xs[i])) {
        pen_down = false;  // a gap, not a line through missing data
        continue;
      }
      double px = x_axis_scale.pixel(xs[i]), py = y_axis_scale.pixel(value);
      path += fmt::format("{}{:.1f},{:.1f} ", pen_down ? "L" : "M", px, py);
      pen_down = true;
      std::string x_text = numeric_x ? number_attribute(xs[i]) : chart.x_categories[i];
      marks += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.2\" data-x=\"{}\" "
          "data-y=\"{}\"><title>{}</title></circle>\n",
          px, py, escape_html(x_text), number_attribute(value),
          escape_html(series.name + ", " + (numeric_x ? tick_label(xs[i]) : x_text) + ": " +
                      shown_value(value, chart)));
    }
    out += fmt::format(
        "<g class=\"kv-series s{}\" data-series=\"{}\" data-series-index=\"{}\" fill=\"{}\">\n"
        "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" "
        "stroke-dasharray=\"{}\"/>\n{}</g>\n",
        s, escape_html(series.name), s, color, path, color, kDashes[s % kDashes.size()], marks);
  }
  return out + "</svg>\n";
}

struct Rgb {
  double r, g, b;
};

Rgb mix(Rgb a, Rgb b, double t) {
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}

std::string hex(Rgb c) {
  auto byte = [](double v) { return static_cast<int>(std::lround(std::clamp(v, 0.0, 255.0))); };
  return fmt::format("#{:02x}{:02x}{:02x}", byte(c.r), byte(c.g), byte(c.b));
}

// Sequential: pale to deep blue over [lo, hi]. Diverging: red below zero, white at
// zero, blue above, symmetric so equal magnitudes get equal strength.
Rgb heat_color(double value, double lo, double hi, bool diverging) {
  const Rgb pale{247, 251, 255}, deep{8, 48, 107}, red{178, 24, 43}, white{247, 247, 247},
      blue{33, 102, 172};
  if (diverging) {
    double limit = std::max(std::fabs(lo), std::fabs(hi));
    double t = limit > 0 ? std::clamp(value / limit, -1.0, 1.0) : 0.0;
    return t < 0 ? mix(white, red, -t) : mix(white, blue, t);
  }
  double t = hi > lo ? std::clamp((value - lo) / (hi - lo), 0.0, 1.0) : 0.5;
  return mix(pale, deep, t);
}

std::string heatmap_chart(const Chart& chart) {
  size_t columns = chart.x_categories.size(), rows = chart.series.size();
  size_t longest_row = 4;
  for (const Series& series : chart.series)
    longest_row = std::max(longest_row, display_width(series.name));
  double left = std::min(220.0, 16 + 7.0 * static_cast<double>(longest_row)) + 24;
  double top = 16, legend_width = 110;
  double cell_width = std::min(
      96.0, (kWidth - left - legend_width) / static_cast<double>(std::max<size_t>(columns, 1)));
  double cell_height =
      std::clamp(300.0 / static_cast<double>(std::max<size_t>(rows, 1)), 16.0, 36.0);
  double bottom = top + cell_height * static_cast<double>(rows);
  double key_height = std::max(bottom - top, 100.0);
  bool rotate = false;
  for (const std::string& category : chart.x_categories)
    rotate |= static_cast<double>(display_width(category)) * 7 > cell_width;
  double height = std::max(bottom + (rotate ? 76 : 56), top + key_height + 30);
  std::string out = svg_open(chart, height);
  double lo = INFINITY, hi = -INFINITY;
  for (const Series& series : chart.series) {
    for (double v : series.y) {
      if (!std::isfinite(v)) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (!std::isfinite(lo)) lo = hi = 0;
  bool show_text = cell_width >= 40 && cell_height >= 16;
  Chart plain;  // cell texts and the key show bare numbers; the unit is under the key
  plain.precision = chart.precision;
  for (size_t r = 0; r < rows; ++r) {
    const Series& series = chart.series[r];
    double y = top + cell_height * static_cast<double>(r);
    out += fmt::format(
        "<g class=\"kv-series\" data-series=\"{}\" data-series-index=\"{}\">\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" fill=\"currentColor\">{}</text>\n",
        escape_html(series.name), r, left - 8, y + cell_height / 2 + 4, escape_html(series.name));
    for (size_t c = 0; c < columns && c < series.y.size(); ++c) {
      double value = series.y[c];
      double x = left + cell_width * static_cast<double>(c);
      bool known = std::isfinite(value);
      Rgb fill = known ? heat_color(value, lo, hi, chart.diverging) : Rgb{160, 160, 160};
      std::string title = escape_html(series.name + ", " + chart.x_categories[c] + ": " +
                                      shown_value(value, chart));
      out += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\" "
          "fill-opacity=\"{}\" data-x=\"{}\" data-y=\"{}\"><title>{}</title></rect>\n",
          x, y, cell_width - 1, cell_height - 1, hex(fill), known ? "1" : "0.35",
          escape_html(chart.x_categories[c]), number_attribute(value), title);
      if (show_text) {
        double luminance = 0.2126 * fill.r + 0.7152 * fill.g + 0.0722 * fill.b;
        out += fmt::format(
            "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"10\" "
            "fill=\"{}\">{}</text>\n",
            x + cell_width / 2, y + cell_height / 2 + 3.5, luminance > 140 ? "#111" : "#fff",
            escape_html(known ? shown_value(value, plain) : "n/a"));
      }
    }
    out += "</g>\n";
  }
  out += "<g class=\"kv-axis kv-axis-x\">\n";
  for (size_t c = 0; c < columns; ++c) {
    double center = left + cell_width * (static_cast<double>(c) + 0.5);
    out += rotate ? fmt::format(
                        "<text transform=\"translate({:.1f} {:.1f}) rotate(-30)\" "
                        "text-anchor=\"end\" fill=\"currentColor\">{}</text>\n",
                        center, bottom + 14, escape_html(chart.x_categories[c]))
                  : fmt::format(
                        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" "
                        "fill=\"currentColor\">{}</text>\n",
                        center, bottom + 16, escape_html(chart.x_categories[c]));
  }
  double right = left + cell_width * static_cast<double>(columns);
  out += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"currentColor\" "
      "class=\"kv-axis-label\">{}</text>\n"
      "<text transform=\"translate(14 {:.1f}) rotate(-90)\" text-anchor=\"middle\" "
      "fill=\"currentColor\" class=\"kv-axis-label\">{}</text>\n</g>\n",
      (left + right) / 2, bottom + (rotate ? 60 : 40), escape_html(chart.x_label),
      (top + bottom) / 2, escape_html(chart.y_label));
  // Colour key: ten steps from the lowest to the highest value (or -max..max).
  double key_x = right + 28, key_top = top;
  double key_lo = chart.diverging ? -std::max(std::fabs(lo), std::fabs(hi)) : lo;
  double key_hi = chart.diverging ? std::max(std::fabs(lo), std::fabs(hi)) : hi;
  out += "<g class=\"kv-color-key\">\n";
  for (int step = 0; step < 10; ++step) {
    double value = key_hi - (key_hi - key_lo) * (step + 0.5) / 10;
    out += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"16\" height=\"{:.1f}\" fill=\"{}\"/>\n", key_x,
        key_top + key_height * step / 10, key_height / 10 + 0.5,
        hex(heat_color(value, lo, hi, chart.diverging)));
  }
  out += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"currentColor\" font-size=\"11\">{}</text>\n"
      "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"currentColor\" font-size=\"11\">{}</text>\n",
      key_x + 22, key_top + 9, escape_html(shown_value(key_hi, plain)), key_x + 22,
      key_top + key_height, escape_html(shown_value(key_lo, plain)));
  if (!chart.value_unit.empty()) {
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"currentColor\" font-size=\"11\">{}</text>\n", key_x,
        key_top + key_height + 18, escape_html(chart.value_unit));
  }
  return out + "</g>\n</svg>\n";
}

}  // namespace

std::string render_chart_svg(const Chart& chart) {
  switch (chart.kind) {
    case ChartKind::bars:
      return bars_chart(chart);
    case ChartKind::lines:
      return lines_chart(chart);
    case ChartKind::heatmap:
      return heatmap_chart(chart);
  }
  return bars_chart(chart);
}

}  // namespace kvaudit::report
