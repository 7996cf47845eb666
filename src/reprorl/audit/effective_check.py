"""Audit question 10: did every spec field take effect? The effective config and the spec, field by field."""

from __future__ import annotations

from reprorl.audit.facts import Finding, RunFacts, short
from reprorl.hashing import content_hash
from reprorl.orchestrate.run.effective import EFFECTIVE_FILE, LABELS, disagreements
from reprorl.store.documents import json_doc

SHOWN = 8


def effective(f: RunFacts) -> Finding:
    """10. What each component reported using (`effective.json`) agrees with `spec.json` on every field."""
    out = Finding()
    spec = f.need_spec(out)
    if spec is None:
        return out
    document, error = json_doc(f.path / EFFECTIVE_FILE)
    if document is None:
        out.fail(f"{EFFECTIVE_FILE}: {error or 'missing'}; no record says what the components used")
        return out
    logged = f.events_named("effective_config")
    if not logged:
        out.fail(f"no effective_config event in events.jsonl vouches for {EFFECTIVE_FILE}")
    elif logged[-1].get("hash") != content_hash(document):
        out.fail(
            f"{EFFECTIVE_FILE} hashes to {short(content_hash(document))}, the effective_config event "
            f"recorded {short(str(logged[-1].get('hash')))}: it was changed after the run wrote it"
        )
    fields = document.get("fields")
    if not isinstance(fields, dict):
        out.fail(f"{EFFECTIVE_FILE} holds no fields")
        return out
    wrong = disagreements(spec, fields)
    for path, wanted, used in wrong[:SHOWN]:
        out.fail(f"{path}: spec.json says {wanted!r}, the component that uses it reported {used!r}")
    if len(wrong) > SHOWN:
        out.fail(f"... and {len(wrong) - SHOWN} more fields disagree")
    if not wrong:
        out.ok(
            f"{EFFECTIVE_FILE}: all {len(fields)} configured fields agree with spec.json, each as read "
            f"from the component that uses it; label-only: {', '.join(sorted(LABELS))}"
        )
    return out
