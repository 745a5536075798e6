"""Unit tests of benchmarks/render_performance.py: its check fails on a changed JSON, a hand-edited table and a JSON
no section renders; the generic section renders every list of rows; and the links of docs/performance.md (and the
documents' links into it) resolve. Runs no benchmark (ctest -R RenderPerformance)."""
import json
import re
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import render_performance as rp  # noqa: E402

DOC = REPO / "docs/performance.md"
RESULTS = REPO / "benchmarks/results"


def fixed_date(_path):
    return "2026-01-01"


class Check(unittest.TestCase):
    """--check against temporary copies of the document and the JSON."""

    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="render-performance-test."))
        self.results = self.tmp / "results"
        shutil.copytree(RESULTS, self.results)
        self.doc = self.tmp / "performance.md"
        self.doc.write_text(rp.render(DOC.read_text(), self.results, fixed_date))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def check(self):
        return rp.render(self.doc.read_text(), self.results, fixed_date) == self.doc.read_text()

    def test_a_rendered_document_passes(self):
        self.assertTrue(self.check())

    def test_a_changed_json_fails_until_rendered_again(self):
        path = self.results / "quota_history_bench.json"
        data = json.loads(path.read_text())
        data["starts"][0]["serve_start_s"] = 9.87654
        path.write_text(json.dumps(data))
        self.assertFalse(self.check())
        self.doc.write_text(rp.render(self.doc.read_text(), self.results, fixed_date))
        self.assertTrue(self.check())
        self.assertIn("| 9.877 |", self.doc.read_text())

    def test_a_hand_edited_table_fails(self):
        text = self.doc.read_text()
        edited = text.replace("| 10.12 |", "| 10.13 |", 1)
        self.assertNotEqual(edited, text)
        self.doc.write_text(edited)
        self.assertFalse(self.check())

    def test_text_outside_the_markers_is_kept(self):
        text = self.doc.read_text().replace("## Data pipeline\n", "## Data pipeline\n\nA hand-written line.\n", 1)
        self.assertEqual(rp.render(text, self.results, fixed_date), text)

    def test_a_json_without_a_section_fails(self):
        (self.results / "new_bench.json").write_text('{"rows": []}')
        with self.assertRaisesRegex(ValueError, "new_bench.json: no section renders it"):
            rp.render(self.doc.read_text(), self.results, fixed_date)

    def test_a_missing_marker_fails(self):
        text = self.doc.read_text().replace(rp.BEGIN.format("nms_bench"), "", 1)
        with self.assertRaisesRegex(ValueError, "section nms_bench: no marker"):
            rp.render(text, self.results, fixed_date)

    def test_the_command_line_check_exits_1_on_a_difference(self):
        if not rp.GitDates(REPO).usable:
            self.skipTest("no full git history")
        self.doc.write_text(DOC.read_text().replace("| 10.12 |", "| 10.13 |", 1))
        self.assertEqual(rp.main(["--check", "--doc", str(self.doc), "--results", str(RESULTS)]), 1)


class Generic(unittest.TestCase):
    def test_every_list_of_rows_is_a_table_and_dates_come_from_the_json(self):
        data = {"date": "2026-12-05T03:30:45Z", "cores": 2,
                "starts": [{"layout": "a", "serve_start_s": 0.130679}, {"layout": "b", "serve_start_s": 4.7744}],
                "postgresql": {"starts": [{"layout": "a", "serve_start_s": 0.5, "extra": 3}]}}
        out = "\n".join(rp.generic("x", data, fixed_date))
        self.assertIn("- date: 2026-12-05T03:30:45Z", out)
        self.assertIn("| cores | 2 |", out)
        self.assertIn("`starts`:", out)
        self.assertIn("| a | 0.1307 |", out)
        self.assertIn("| b | 4.774 |", out)
        self.assertIn("`postgresql.starts`:", out)
        self.assertIn("| layout | serve_start_s | extra |", out)

    def test_a_json_without_a_date_says_where_its_date_comes_from(self):
        out = "\n".join(rp.generic("x", {"threads": 1}, fixed_date))
        self.assertIn("- date: 2026-01-01 (the JSON holds no date: the day its file was last committed", out)
        self.assertIn("- machine: not recorded in the JSON (it holds threads 1)", out)


def slug(heading):
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path):
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", path.read_text(), re.M)}


LINK = re.compile(r"\]\(([^)\s]+)\)")


class Links(unittest.TestCase):
    def test_every_link_of_the_document_resolves(self):
        for target in LINK.findall(DOC.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            path = (DOC.parent / file).resolve() if file else DOC
            self.assertTrue(path.exists(), f"docs/performance.md links to {target}: no such file")
            if anchor and path.suffix == ".md":
                self.assertIn(anchor, anchors(path), f"docs/performance.md links to {target}: no such heading")

    def test_every_link_into_the_document_names_one_of_its_headings(self):
        own = anchors(DOC)
        for md in REPO.glob("**/*.md"):
            if any(p in (".git", "build", ".venv", ".deps", "node_modules") for p in md.relative_to(REPO).parts):
                continue
            for target in LINK.findall(md.read_text(errors="replace")):
                file, _, anchor = target.partition("#")
                if anchor and file.endswith("performance.md") and (md.parent / file).resolve() == DOC:
                    self.assertIn(anchor, own, f"{md.relative_to(REPO)} links to {target}: no such heading")


if __name__ == "__main__":
    unittest.main()
