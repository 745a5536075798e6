"""Unit tests of benchmarks/peer_compare.py's pure logic: the README splice, ratios, the accuracy verdict and the
table's rows without the peer (ctest -R PeerCompare; no build products, no peer needed)."""
import sys
import unittest
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import peer_compare as pc  # noqa: E402

B, E = pc.README_BEGIN, pc.README_END


class SpliceReadme(unittest.TestCase):
    def test_replaces_only_between_the_markers(self):
        text = f"# T\n\n| keep | row |\n\n{B}\nold table\nold line\n{E}\nafter\n"
        out = pc.splice_readme(text, "| new |\n")
        self.assertEqual(out, f"# T\n\n| keep | row |\n\n{B}\n| new |\n{E}\nafter\n")

    def test_is_idempotent(self):
        text = f"a\n{B}\nx\n{E}\nb\n"
        once = pc.splice_readme(text, "t1\nt2")
        self.assertEqual(pc.splice_readme(once, "t1\nt2"), once)

    def test_refuses_missing_repeated_or_reversed_markers(self):
        for text in ("no markers", f"{B}\n", f"{B}{E}{B}{E}", f"{E}\n{B}\n"):
            with self.assertRaises(ValueError, msg=text):
                pc.splice_readme(text, "t")

    def test_the_readme_has_one_pair_of_markers(self):
        readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
        pc.splice_readme(readme, "t")  # raises if not


class Ratios(unittest.TestCase):
    def test_direction(self):
        self.assertAlmostEqual(pc.ratio(300, 100, True), 3.0)   # throughput: ours / peer
        self.assertAlmostEqual(pc.ratio(50, 100, False), 2.0)   # times: peer / ours

    def test_none_without_both_sides(self):
        self.assertIsNone(pc.ratio(None, 100, True))
        self.assertIsNone(pc.ratio(100, None, False))
        self.assertIsNone(pc.ratio(0, 100, True))


class AccuracyVerdict(unittest.TestCase):
    def test_overlapping_ranges(self):
        v = pc.accuracy_verdict(pc.spread([0.70, 0.74]), pc.spread([0.73, 0.76]))
        self.assertTrue(v["ranges_overlap"])
        self.assertAlmostEqual(v["mean_difference"], -0.025)
        self.assertAlmostEqual(v["largest_spread"], 0.04)
        self.assertTrue(v["within_spread"])

    def test_separate_ranges(self):
        v = pc.accuracy_verdict(pc.spread([0.60, 0.61]), pc.spread([0.75, 0.76]))
        self.assertFalse(v["ranges_overlap"])
        self.assertFalse(v["within_spread"])

    def test_none_without_peer(self):
        self.assertIsNone(pc.accuracy_verdict(pc.spread([0.7]), None))


class TableWithoutPeer(unittest.TestCase):
    def test_no_ratio_and_says_so(self):
        res = {"peer": {"available": False}, "startup": {
            "repeats": 1, "ultralytics": None, "ours": 1.5, "ratio": None}}
        rows = pc.table_rows(res)
        self.assertEqual(len(rows), 1)
        self.assertEqual(rows[0][1:], ("peer not found", "1.50", "—"))


class ResultsCsv(unittest.TestCase):
    def test_last_row_stripped(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("  epoch,  metrics/mAP50-95(B)\n  1,  0.1\n  2,  0.25\n")
        self.assertEqual(pc.parse_results_csv(f.name), {"epoch": "2", "metrics/mAP50-95(B)": "0.25"})
        Path(f.name).unlink()


if __name__ == "__main__":
    unittest.main()
