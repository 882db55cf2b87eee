"""The query-formulation measure of `make learn-search` (trainer/proofs/written_queries.py), against a real BM25
service over the fixture corpus: a good query found in a call that never parsed counts, a bad one does not, and an
episode without a search opening wrote no query."""

from __future__ import annotations

from searchrl.trainer.proofs.search_env import SEARCH_OPENING, written_query
from searchrl.trainer.proofs.written_queries import would_retrieve


def test_the_written_query_is_read_to_its_closing_quote_whether_or_not_the_call_parsed():
    assert written_query(SEARCH_OPENING + 'Swedish film Bergman"]}}}}\n}') == "Swedish film Bergman"
    assert written_query(SEARCH_OPENING + "Swedish film Bergman and the turn ran to its cap") == (
        "Swedish film Bergman and the turn ran to its cap"
    )
    assert written_query("<answer> Paris</answer>") is None  # search off: no opening, no query
    assert written_query(SEARCH_OPENING + ' "]}}') is None  # an empty query


def test_a_query_that_names_the_passage_would_retrieve_it_though_its_call_broke(live_bm25_url: str):
    records = [
        # run 9's trained model: the question's sentence, then one brace too many (no search ran)
        {
            "response": SEARCH_OPENING + '1957 Swedish fantasy film directed by Ingmar Bergman"]}}}}',
            "golden_answers": ["The Seventh Seal"],
        },  # fmt: skip
        {"response": SEARCH_OPENING + 'your query"]}}', "golden_answers": ["The Seventh Seal"]},
        {"response": "<answer> The Seventh Seal</answer>", "golden_answers": ["The Seventh Seal"]},
    ]
    assert would_retrieve(records, live_bm25_url, topk=3) == [True, False, False]
    assert would_retrieve([], live_bm25_url, topk=3) == []
