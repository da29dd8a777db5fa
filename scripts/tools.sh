# Sourced by the scripts: every tool the checks use, at its pinned version, and how each is installed. `need <tool>`
# installs one if it is missing, under a lock, so two scripts that need it at once install it once:
# scripts/install-tools installs them side by side while something else compiles, and each script still asks for
# its own, so each runs alone on a fresh clone.
#
# The virtualenvs and cargo-fuzz are kept per machine, by version, in $ONEJOB_TOOLS (~/.cache/onejob-tools unless
# set), as `cargo install` keeps its tools in ~/.cargo: a checkout's .venv-*/ and .tools/cargo-fuzz are links into
# it, so a fresh clone reuses what the machine installed at the same pinned versions, and a version bump installs
# anew beside the old one.

MOTO_VERSION=5.2.5
SAM_TRANSLATOR_VERSION=1.110.0
CFN_LINT_VERSION=1.58.0
CARGO_LAMBDA_VERSION=1.9.2
SAM_CLI_VERSION=1.170.0
SCHEMATHESIS_VERSION=4.32.5
# Its property-testing engine, pinned too: a release of it is not a change of ours.
HYPOTHESIS_VERSION=6.170.27
GENERATOR_VERSION=0.29.1
CARGO_FUZZ_VERSION=0.13.2

TOOLS="moto deploy sam arm64 api-fuzz python-client chromium playwright cargo-fuzz"
ONEJOB_TOOLS=${ONEJOB_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/onejob-tools}

# The name a machine-kept <tool> has in the checkout, and its folder in $ONEJOB_TOOLS (nothing for the others).
kept() {
  case "$1" in
    moto) echo ".venv-test moto-$MOTO_VERSION-sam-translator-$SAM_TRANSLATOR_VERSION" ;;
    deploy) echo ".venv-deploy cfn-lint-$CFN_LINT_VERSION-cargo-lambda-$CARGO_LAMBDA_VERSION" ;;
    sam) echo ".venv-sam sam-cli-$SAM_CLI_VERSION" ;;
    api-fuzz) echo ".venv-api schemathesis-$SCHEMATHESIS_VERSION-hypothesis-$HYPOTHESIS_VERSION" ;;
    python-client) echo ".venv-client openapi-python-client-$GENERATOR_VERSION" ;;
    cargo-fuzz) echo ".tools/cargo-fuzz cargo-fuzz-$CARGO_FUZZ_VERSION" ;;
  esac
}

# Whether <tool> is there, at its version.
has() {
  case "$1" in
    # In its own virtualenv at its version: a venv that lost its pyvenv.cfg runs the machine's Python, whose moto
    # (if any) is another one.
    moto) .venv-test/bin/python -c "import sys, moto.cloudformation, samtranslator, jsonpath_ng
assert sys.prefix != sys.base_prefix and moto.__version__ == '$MOTO_VERSION'" ;;
    deploy) says "$CFN_LINT_VERSION" .venv-deploy/bin/cfn-lint --version \
      && says "$CARGO_LAMBDA_VERSION" .venv-deploy/bin/cargo-lambda lambda --version ;;
    sam) says "$SAM_CLI_VERSION" .venv-sam/bin/sam --version ;;
    arm64) says aarch64-unknown-linux-gnu rustup target list --installed ;;
    api-fuzz) says "$SCHEMATHESIS_VERSION" .venv-api/bin/st --version ;;
    python-client) says "$GENERATOR_VERSION" .venv-client/bin/openapi-python-client --version \
      && .venv-client/bin/python -c "import dateutil" ;;
    chromium) command -v chromium ;;
    playwright) [ -d tests/browser/node_modules/playwright-core ] ;;
    cargo-fuzz) says "$CARGO_FUZZ_VERSION" .tools/cargo-fuzz/bin/cargo-fuzz --version ;;
    *) echo "scripts/tools.sh: no tool $1" >&2; return 2 ;;
  esac
} >/dev/null 2>&1

# Whether the command that follows <text> runs and prints it (read whole: `grep -q` in a pipe could end the
# command early, and pipefail would take that for a failure).
says() {
  local text=$1 out
  shift
  out=$("$@") && [[ $out == *"$text"* ]]
}

# A fresh virtualenv at <dir> with the packages that follow.
venv() {
  local dir=$1
  shift
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install --quiet --disable-pip-version-check "$@"
}

# Installs <tool>; a machine-kept one into <dest>, its folder in $ONEJOB_TOOLS.
install() {
  local dest=${2:-}
  case "$1" in
    # moto, with what its CloudFormation needs, and the SAM translator: the tests' AWS (scripts/test).
    moto) venv "$dest" "moto[cloudformation,dynamodb,events,sqs,secretsmanager]==$MOTO_VERSION" \
      "aws-sam-translator==$SAM_TRANSLATOR_VERSION" flask flask-cors ;;
    # cfn-lint and cargo-lambda (zig comes with it from PyPI): scripts/check-deploy.
    deploy) venv "$dest" "cfn-lint==$CFN_LINT_VERSION" "cargo-lambda==$CARGO_LAMBDA_VERSION" ;;
    # aws-sam-cli apart: its pins fight moto's and cfn-lint's.
    sam) venv "$dest" "aws-sam-cli==$SAM_CLI_VERSION" ;;
    arm64) rustup target add aarch64-unknown-linux-gnu ;;
    # schemathesis, with hypothesis pinned (scripts/api-fuzz says why).
    api-fuzz) venv "$dest" "schemathesis==$SCHEMATHESIS_VERSION" "hypothesis==$HYPOTHESIS_VERSION" ;;
    # The generator, and what the client it writes imports (httpx and attrs come with the generator).
    python-client) venv "$dest" "openapi-python-client==$GENERATOR_VERSION" python-dateutil ;;
    # Debian's headless-capable Chromium, and playwright-core to drive it (scripts/browser-test).
    chromium)
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y --no-install-recommends chromium >/dev/null 2>&1 \
        || { apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null; } ;;
    playwright) npm ci --prefix tests/browser --no-audit --no-fund >/dev/null ;;
    cargo-fuzz) cargo install --quiet --locked --root "$dest" cargo-fuzz --version "$CARGO_FUZZ_VERSION" ;;
  esac
}

# Installs each <tool> that is missing, under its lock: a machine-kept one is linked from the checkout first, and
# installed only if the machine does not have it at this version.
need() {
  local tool lock name folder dest
  mkdir -p .tools "$ONEJOB_TOOLS"
  for tool in "$@"; do
    has "$tool" && continue
    read -r name folder <<<"$(kept "$tool")"
    if [ -n "$name" ]; then
      dest="$ONEJOB_TOOLS/$folder"
      exec {lock}>"$dest.lock"
    else
      dest=
      exec {lock}>".tools/$tool.lock"
    fi
    flock "$lock"
    if [ -n "$name" ]; then
      [ -L "$name" ] || rm -rf "$name"
      ln -sfn "$dest" "$name"
    fi
    if ! has "$tool"; then
      echo "${0#./}: installing $tool (once${name:+ per machine, into $dest})"
      install "$tool" "$dest"
      has "$tool" || { echo "${0#./}: $tool did not install" >&2; return 1; }
    fi
    exec {lock}>&-
  done
}

# Runs a command and says how long it took (the CI table in docs/layout.md comes from these lines).
timed() {
  local started=$SECONDS status=0
  "$@" || status=$?
  echo "${0#./}: $* took $((SECONDS - started)) s"
  return "$status"
}
