#!/usr/bin/env bash
# The AWS SAM CLI in its own venv (.tools): it pins its own boto3/botocore, kept apart from .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .tools/bin/sam ]; then
  python3 -m venv .tools
  .tools/bin/pip install -q --upgrade pip
  .tools/bin/pip install -q aws-sam-cli
fi
