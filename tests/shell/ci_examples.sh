#!/usr/bin/env bash
# The CI examples run as CI runs them. examples/ci/github-actions-kvaudit.yml: its `run:`
# steps in order with bash -eo pipefail, the workflow's env (the checkpoint and unit replaced
# by the demo's), GITHUB_PATH honoured and `if:` followed, skipping only `uses:` steps (they
# need GitHub) and the one step named below that builds kvaudit; the files the upload steps
# name must exist and validate against their schemas. .pre-commit-hooks.yaml: the hook's
# entry on fixture units, with the file filter applied, the way pre-commit calls it.
# usage: ci_examples.sh KVAUDIT_BINARY SOURCE_DIR BUILD_DIR
source "$(dirname "$0")/lib.bash" "$@"

# shellcheck source=tests/shell/ci_validate.bash
source "$root/tests/shell/ci_validate.bash"
require_validators "$build" || exit 1
demo=$("$root/tools/ensure-demo-checkpoint.sh" "$build") || exit 1
# The kvaudit under test, found on PATH as the workflow's build step leaves it.
mkdir -p "$work/bin"
ln -s "$kvaudit" "$work/bin/kvaudit"

# run_workflow WORKSPACE KEY=VALUE...: runs the workflow's steps in WORKSPACE with those env
# values overriding the workflow's; prints one JSON object per step.
run_workflow() {
  /usr/bin/python3 - "$root/examples/ci/github-actions-kvaudit.yml" "$work/bin" "$@" <<'PY'
import json, os, re, subprocess, sys, yaml

workflow_path, bin_dir, workspace, *overrides = sys.argv[1:]
# The one step not run here, and why. The test fails if the workflow loses it (renamed steps
# must be listed again) and when a `run:` step it does not know cannot run.
NOT_RUN = {"Build kvaudit": "it compiles kvaudit from source (about 15 minutes on 2 cores); "
           "the kvaudit under test stands in for it, on PATH as the step's last line puts it"}
workflow = yaml.safe_load(open(workflow_path))
(job,) = workflow["jobs"].values()
names = [step.get("name") for step in job["steps"]]
for name in NOT_RUN:
    assert name in names, f"NOT_RUN names '{name}', which the workflow no longer has"

context = {"github.workspace": workspace, "vars.KVAUDIT_REPOSITORY": "owner/kvaudit"}
def expand(text):
    def one(match):
        key = match.group(1).strip()
        if key not in context:
            raise SystemExit(f"ci_examples: the workflow uses ${{{{ {key} }}}}, which this test does not supply")
        return context[key]
    return re.sub(r"\$\{\{(.*?)\}\}", one, str(text))

env = dict(os.environ)
for scope in (workflow.get("env", {}), job.get("env", {})):
    env.update({key: expand(value) for key, value in scope.items()})
env.update(dict(override.split("=", 1) for override in overrides))
files = {name: os.path.join(workspace, ".github-" + name) for name in ("path", "env", "summary")}
for path in files.values():
    open(path, "w").close()
env.update(CI="true", GITHUB_ACTIONS="true", GITHUB_WORKSPACE=workspace, GITHUB_PATH=files["path"],
           GITHUB_ENV=files["env"], GITHUB_STEP_SUMMARY=files["summary"], RUNNER_TEMP=workspace)
env["PATH"] = bin_dir + os.pathsep + env["PATH"]
shell = job.get("defaults", {}).get("run", {}).get("shell", "bash")
assert shell == "bash", f"steps run with '{shell}', this test runs bash"

failed = False
for step in job["steps"]:
    name = step.get("name") or step.get("uses") or step["run"].splitlines()[0]
    condition = str(step.get("if", "success()")).strip().removeprefix("${{").removesuffix("}}").strip()
    if condition not in ("success()", "always()"):
        raise SystemExit(f"ci_examples: step '{name}' has if: {condition}, which this test does not evaluate")
    runs = condition == "always()" or not failed
    record = {"name": name, "runs": runs}
    if "uses" in step:
        record.update(kind="uses", uses=step["uses"],
                      inputs={key: expand(value) for key, value in step.get("with", {}).items()})
    elif name in NOT_RUN:
        record.update(kind="not run", why=NOT_RUN[name])
        print(f"ci_examples: not run here: step '{name}': {NOT_RUN[name]}", file=sys.stderr)
    elif runs:
        step_env = dict(env)
        step_env.update({key: expand(value) for key, value in step.get("env", {}).items()})
        added = [line for line in open(files["path"]).read().splitlines() if line]
        step_env["PATH"] = os.pathsep.join(added[::-1] + [step_env["PATH"]])
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", expand(step["run"])],
                              cwd=workspace, env=step_env, capture_output=True, text=True, timeout=300)
        record.update(kind="run", exit=done.returncode, output=(done.stdout + done.stderr)[-2000:])
        failed |= done.returncode != 0
    else:
        record.update(kind="skipped")
    print(json.dumps(record))
PY
}

# step_field STEPS_FILE NAME FIELD: a field of the named step's record.
step_field() {
  /usr/bin/python3 -c 'import json, sys
for line in open(sys.argv[1]):
    step = json.loads(line)
    if step["name"] == sys.argv[2]:
        value = step
        for key in sys.argv[3].split("."):
            value = value.get(key, "") if isinstance(value, dict) else ""
        print(value if not isinstance(value, bool) else str(value).lower())' "$@"
}

# workspace NAME: a checkout holding the deployment's unit at the path the workflow names.
workspace() {
  local dir=$work/$1
  mkdir -p "$dir/deploy"
  cp "$root/examples/qwen3.5-397b-a17b-nvfp4/sglang.service" "$dir/deploy/sglang.service"
  echo "$dir"
}

# --- The workflow as written (--kv-policy evidence): the demo's FP8-at-scale-1.0 finding is a
# warning, the audit passes, both files are written and valid.
ws=$(workspace evidence)
run_workflow "$ws" "KVAUDIT_MODEL=$demo" > "$work/evidence.steps" || fail "the workflow runner stopped"
grep -q '"kind": "not run"' "$work/evidence.steps" && pass || fail "the build step was run"
[[ $(step_field "$work/evidence.steps" "Audit the deployment" exit) == 0 ]] && pass ||
  fail "audit step under --kv-policy evidence: $(step_field "$work/evidence.steps" "Audit the deployment" output)"
sarif=$ws/$(step_field "$work/evidence.steps" "Upload the findings to code scanning" inputs.sarif_file)
junit=$ws/$(step_field "$work/evidence.steps" "Keep the JUnit report" inputs.path)
validate_sarif "$sarif" && pass || fail "the workflow's SARIF ($sarif)"
validate_junit "$junit" && pass || fail "the workflow's JUnit ($junit)"
/usr/bin/python3 - "$sarif" "$junit" <<'PY' && pass || fail "the workflow's files: unit location, no failure"
import json, sys, xml.etree.ElementTree as ET
run = json.load(open(sys.argv[1]))["runs"][0]
units = [r for r in run["results"] if r["locations"][0].get("physicalLocation", {})
         .get("artifactLocation", {}).get("uri") == "deploy/sglang.service"]
assert units, [r["locations"] for r in run["results"]]
assert units[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"] == "%SRCROOT%"
assert any(r["ruleId"] == "fp8-unit-scale" and r["level"] == "warning" for r in run["results"])
suite = ET.parse(sys.argv[2]).getroot().find("testsuite")
assert suite.get("failures") == "0" and int(suite.get("tests")) > 0, suite.attrib
PY

# --- Under --kv-policy lossless the audit fails the job (exit 1), and the upload steps still
# run (if: always()) on files the failed step wrote.
ws=$(workspace lossless)
run_workflow "$ws" "KVAUDIT_MODEL=$demo" KVAUDIT_KV_POLICY=lossless > "$work/lossless.steps" ||
  fail "the workflow runner stopped"
[[ $(step_field "$work/lossless.steps" "Audit the deployment" exit) == 1 ]] && pass ||
  fail "audit step under lossless: $(step_field "$work/lossless.steps" "Audit the deployment" output)"
[[ $(step_field "$work/lossless.steps" "Upload the findings to code scanning" runs) == true ]] &&
  pass || fail "upload-sarif would not run after the failed audit"
[[ $(step_field "$work/lossless.steps" "Keep the JUnit report" runs) == true ]] &&
  pass || fail "the JUnit upload would not run after the failed audit"
validate_sarif "$ws/kvaudit.sarif" && pass || fail "the failed audit's SARIF"
validate_junit "$ws/kvaudit.xml" && pass || fail "the failed audit's JUnit"
grep -q '<failure type="critical"' "$ws/kvaudit.xml" && pass || fail "no critical failure in the JUnit"

# --- The pre-commit hook: entry + args + the files its filter lets through, as pre-commit
# runs it. The old unit fails the commit (lossless), the fixed one passes, a README is no unit.
mkdir -p "$work/repo"
cp "$root/examples/qwen3.5-397b-a17b-nvfp4/sglang.service" "$work/repo/old.service"
sed 's/--trust-remote-code$/--trust-remote-code --kv-cache-dtype bf16/' "$work/repo/old.service" \
  > "$work/repo/fixed.service"
grep -q -- '--kv-cache-dtype bf16' "$work/repo/fixed.service" || fail "could not write the fixed unit"
cp "$root/README.md" "$work/repo/README.md"
cp "$root/examples/qwen3.5-397b-a17b-nvfp4/deploy/kubernetes-deployment.yaml" "$work/repo/deploy.yaml"
cp "$root/.pre-commit-hooks.yaml" "$work/repo/other.yaml"  # YAML that launches nothing
# hook_command FILES...: the argv pre-commit would run, one per line.
hook_command() {
  /usr/bin/python3 - "$root" "$@" <<'PY'
import os, re, shlex, sys, yaml
root, *files = sys.argv[1:]
(hook,) = [h for h in yaml.safe_load(open(os.path.join(root, ".pre-commit-hooks.yaml")))
           if h["id"] == "kvaudit-check"]
assert hook["language"] == "script", hook  # entry: a path inside the hook's repository
entry = shlex.split(hook["entry"])
entry[0] = os.path.join(root, entry[0])
keep = [f for f in files if re.search(hook.get("files", ""), f)
        and not (hook.get("exclude") and re.search(hook["exclude"], f))]
user_args = os.environ["HOOK_ARGS"].split("\x1f")
print("\n".join(entry + hook.get("args", []) + user_args + keep))
PY
}
cd "$work/repo" || exit 1
export HOOK_ARGS
HOOK_ARGS=$(printf '%s\x1f' "$demo" --kv-policy lossless --)
HOOK_ARGS=${HOOK_ARGS%$'\x1f'}
mapfile -t argv < <(hook_command old.service fixed.service README.md deploy.yaml other.yaml)
[[ " ${argv[*]} " == *" old.service fixed.service deploy.yaml other.yaml"* && " ${argv[*]} " != *README.md* ]] && pass ||
  fail "the hook's file filter: ${argv[*]}"
out=$(PATH="$work/bin:$PATH" "${argv[@]}" 2>&1); status=$?
[[ $status -eq 1 ]] && pass || fail "hook on the old and fixed units: exit $status, expected 1: $out"
[[ $out == *"old.service: Verdict [critical]"* && $out == *"deploy.yaml: Verdict [critical]"* &&
   $out != *fixed.service* && $out != *other.yaml* ]] && pass ||
  fail "the hook's output should name the old unit and the manifest only: $out"
mapfile -t argv < <(hook_command fixed.service)
out=$(PATH="$work/bin:$PATH" "${argv[@]}" 2>&1); status=$?
[[ $status -eq 0 && -z $out ]] && pass || fail "hook on the fixed unit: exit $status: $out"
out=$(PATH=/usr/bin:/bin "${argv[@]}" 2>&1); status=$?
[[ $status -eq 2 && $out == *"put kvaudit on PATH"* ]] && pass || fail "hook without kvaudit: exit $status: $out"

finish ci_examples
