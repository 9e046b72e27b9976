"""A claim queued by a decision transaction is decided on the document its message parsed to, not on its row
read back (shared/ledger/queue.py takes UnitOfWork.queued_documents); after a restart the row's spec is read
and parsed instead. Both must be the same document, or a restart would change decisions: for every message
of the hostile corpus that reads as a claim (and the lab's and showcase's workloads), the spec the row keeps
parses to a document equal to the message's, field for field."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import yaml

from services.allocator.claim_batch import claim_values
from shared.dra.claims import InvalidClaim, read_submission
from shared.ledger.queue import read_document
from tests.hostile import corpus

ROOT = Path(__file__).resolve().parents[2]


def messages() -> list[tuple[str, bytes, str]]:
    cases = [(case.id, case.payload, case.subject_tenant) for case in corpus.build() if case.action == "submit"]
    for path in sorted(glob.glob(str(ROOT / "shared" / "workloads" / "**" / "*.yaml"), recursive=True)):
        for i, document in enumerate(yaml.safe_load_all(Path(path).read_text())):
            if isinstance(document, dict) and document.get("kind") == "ResourceClaim":
                namespace = (document.get("metadata") or {}).get("namespace") or "default"
                cases.append((f"{Path(path).name}#{i}", json.dumps(document).encode(), namespace))
    return cases


def test_a_claim_reads_back_from_its_row_as_the_document_its_message_parsed_to() -> None:
    read = 0
    for case_id, payload, tenant in messages():
        try:
            claim = read_submission(payload, tenant)
        except InvalidClaim:
            continue
        back = read_document(json.loads(json.dumps(claim_values(claim)["spec"])))  # as the ledger's JSON keeps it
        assert back == claim and back.model_dump() == claim.model_dump(), case_id
        read += 1
    assert read >= 100, f"only {read} messages read as claims: the check covers too little"
