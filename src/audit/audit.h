// audit: turns what the checkpoint says (ModelFacts), what the launch asks for
// (LaunchFlags) and what the engine will do (ResolvedKv) into findings with
// evidence, consequence, fix and reference; and builds the `check` report.
// It decides nothing about engines itself: that is engines/ and its data.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engines/engines.h"
#include "report/report.h"

namespace kvaudit::audit {

struct CheckInput {
  checkpoint::ModelFacts model;
  engines::LaunchFlags flags;
  const engines::EngineModel* engine = nullptr;  // engines::engine_model(flags.engine)
  bool version_given = false;                    // false: judged against the latest known behaviour
  double read_seconds = 0;                       // time spent reading the checkpoint
};

struct CheckResult {
  engines::ResolvedKv resolved;
  std::vector<report::Finding> findings;  // most severe first
};

// Every rule, in a fixed order. Each rule is a plain function of the inputs.
CheckResult run_check(const CheckInput& input);

// Rule ids, so tests can assert that each rule fires and does not fire.
std::vector<std::string> rule_ids();

// The fp8-unit-scale finding's consequence, fix and reference for a release and dtype:
// check and logs report the same finding with the same words (logs adds its own title
// and evidence: the lines that prove the fallback).
struct UnitScaleText {
  std::string consequence;
  std::string fix;
  std::string reference;
};
UnitScaleText unit_scale_text(const engines::EngineModel& engine, const engines::Version& version,
                              const std::string& kv_cache_dtype);

enum class FailOn { critical, warning, never };
// True when some finding is at or above the gate.
bool fails_gate(const std::vector<report::Finding>& findings, FailOn fail_on);

report::Report to_report(const CheckInput& input, const CheckResult& result);

}  // namespace kvaudit::audit
