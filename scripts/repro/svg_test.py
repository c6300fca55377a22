"""Tests of svg.py: tick placement and how series become SVG elements."""
import math
import re
import unittest

from repro import svg


def panel(ys, log=False, **kw):
    return dict(ylabel="y", log=log, series=[dict(label="s", x=list(range(len(ys))), y=ys)], **kw)


class TicksTest(unittest.TestCase):
    def test_nice_ticks(self):
        self.assertEqual(svg.nice_ticks(0, 9000, 8), [0, 2000, 4000, 6000, 8000])
        self.assertEqual(svg.nice_ticks(0.0123, 0.0456), [0.02, 0.03, 0.04])
        self.assertEqual(svg.nice_ticks(-150, 25, 8), [-150, -125, -100, -75, -50, -25, 0, 25])

    def test_a_range_below_float_resolution_ends(self):
        # A flat series padded by 4% of a 1-ulp range: the step is below the resolution of t,
        # and t += step would never move.
        lo = -0.1
        hi = math.nextafter(lo, 0)
        self.assertEqual(len(svg.nice_ticks(lo, hi)), 1)
        text = svg.render_figure([panel([-0.1, hi, -0.1])], (0, 2), "flat")
        self.assertIn("<polyline", text)

    def test_format_tick(self):
        self.assertEqual([svg.format_tick(v) for v in (0, 20000, 0.0005, 2.5, 1000)], ["0", "2e4", "5e-4", "2.5", "1000"])


class RenderTest(unittest.TestCase):
    def test_gaps_break_lines_and_a_lone_point_is_a_dot(self):
        text = svg.render_figure([panel([1, 2, math.nan, 3, 4, None, 5])], (0, 6), "t")
        self.assertEqual(text.count("<polyline"), 2)
        self.assertEqual(text.count("<circle"), 1)

    def test_log_axis_drops_non_positive_values_and_labels_decades(self):
        text = svg.render_figure([panel([0.01, -1, 0.5, 2.0], log=True)], (0, 3), "t")
        self.assertEqual((text.count("<polyline"), text.count("<circle")), (1, 1))
        self.assertEqual(re.findall(r'text-anchor="end">([^<]*)<', text), ["1e-2", "1e-1", "1e0", "1e1"])

    def test_points_outside_the_x_range_and_vlines_outside_it_are_left_out(self):
        text = svg.render_figure([panel([1, 2, 3, 4], vlines=[(1, "in", "#111"), (9, "out", "#222")])], (1, 2), "t")
        points = re.search(r'points="([^"]*)"', text).group(1).split()
        self.assertEqual(len(points), 2)
        self.assertIn(">in<", text)
        self.assertNotIn(">out<", text)

    def test_text_is_escaped_and_height_follows_the_panels(self):
        text = svg.render_figure([panel([1, 2]), panel([3, 4])], (0, 1), "a <b> & c", panel_h=100)
        self.assertIn("a &lt;b&gt; &amp; c", text)
        height = svg.TOP + 2 * (100 + svg.PANEL_GAP) + svg.BOTTOM
        self.assertIn(f'height="{height}"', text.splitlines()[0])

    def test_y_range_padded_on_a_linear_axis(self):
        self.assertEqual(svg._y_range(panel([0.0, 100.0]), 0, 1), (-4.0, 104.0))
        self.assertEqual(svg._y_range(panel([2.0, 2.0]), 0, 1), (1.46, 2.54))
        self.assertEqual(svg._y_range(panel([], ylim=(0, 10)), 0, 1), (-0.4, 10.4))


if __name__ == "__main__":
    unittest.main()
