"""The bad-input corpus of the newer surfaces (:mod:`tests._corpus_newer`): every case
gives a clear error naming its argument, or its valid result, within the time limit."""

import pytest

from tests import _corpus_newer as corpus

#: seconds per case (most take well under one; the sweep and mixture ones a few)
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("corpus_newer")


_IDS = [c.id for c in corpus.cases("unused")]   # ids only: no case runs here


@pytest.mark.parametrize("case_id", _IDS)
def test_newer_surface(case_id, folder):
    case = next(c for c in corpus.cases(str(folder)) if c.id == case_id)
    verdict, detail = corpus.run_case(case, TIMEOUT)
    assert corpus.verdict_ok(case, verdict, detail), (
        f"{case.id}: expected {case.expect} naming {case.names!r}, got {verdict}: {detail}")
