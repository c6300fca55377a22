// Formatting for the keel CLI: aligned text tables, progress bars, numbers for
// people and for machines, the watch table's lines and CSV/JSONL export of
// metric points (the loss plot is plot.h). Pure functions of proto messages; no
// RPCs here, so all of it is testable without a server.
#ifndef KEEL_CLIENT_FORMAT_H_
#define KEEL_CLIENT_FORMAT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "proto/keel.pb.h"

namespace keel {
namespace client {

// Columns padded to the widest cell (header included), separated by two
// spaces, trailing spaces trimmed, one '\n'-terminated line per row.
std::string FormatTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

// "[#####.....]" with `width` cells inside the brackets, filled in proportion to
// step/steps (clamped to [0, width]); steps <= 0 gives an empty bar.
std::string ProgressBar(int64_t step, int64_t steps, int width);

// For machines (CSV, JSONL): a double as the shortest "%.*g" text that reads
// back to the same value ("nan", "inf", "-inf" for non-finite values).
std::string FormatNumber(double value);

// For people (tables, watch, plot labels): four significant digits, trailing
// zeros dropped. Fixed notation when the value rounded to four digits lies in
// [0.001, 10^6), where the integer part is never cut (12345.6 -> "12346"),
// else d.ddde<exponent> ("6e-4", "1.235e7", 999999 -> "1e6"); 0 -> "0",
// non-finite -> "nan", "inf", "-inf". Every table, watch line and plot label
// of the CLI prints its floating-point numbers through this one.
std::string HumanNumber(double value);

// The run state's short name ("RUNNING"); terminal states are SUCCEEDED,
// FAILED, CANCELLED, DIVERGED.
std::string StateName(v1::RunState state);
bool IsTerminal(v1::RunState state);

// "optimizer.lr=6e-4 precision=bf16" (keys sorted).
std::string AxesText(const google::protobuf::Map<std::string, std::string>& axes);

// Milliseconds since the epoch as "2026-11-21 08:18:38" UTC ("-" for 0).
std::string FormatTime(int64_t unix_ms);

// One CSV field: quoted (with "" doubling) when it holds a comma, quote, CR or LF.
std::string CsvField(const std::string& field);

// A JSON string literal with the required escapes.
std::string JsonString(const std::string& text);

// A run and what export/plot fetched for it.
struct RunSeries {
  v1::Run run;
  std::vector<v1::MetricPoint> points;
};

// Sorted union of the axis names of `series`' runs: the export's extra columns.
std::vector<std::string> AxisNames(const std::vector<RunSeries>& series);

// CSV with header sweep_id,run_id,step,loss,lr,tokens_per_s,grad_norm,<axes...>
// and one row per point, runs in the given order. An axis a run lacks is empty.
std::string ExportCsv(const std::vector<RunSeries>& series);

// One JSON object per point with the CSV's fields in the same order; numbers
// as JSON numbers (non-finite ones as null), axis values as strings.
std::string ExportJsonl(const std::vector<RunSeries>& series);

// A run's latest loss for people (HumanNumber), "-" before its first point
// (step 0 and loss 0): the LOSS cell of `keel runs`, `keel show` and watch.
std::string RunLossText(const v1::Run& run);

// The watch table's header and one run's cells: id, state, progress bar with
// step/steps, loss (RunLossText), precision, restarts, interventions.
std::vector<std::string> WatchHeader();
std::vector<std::string> WatchRow(const v1::Run& run, int interventions);

// True for the event kinds that plot and watch count as interventions
// (event_kind::ChangesTrajectory: switch_precision, rollback).
bool IsInterventionEvent(const v1::Event& event);

}  // namespace client
}  // namespace keel

#endif  // KEEL_CLIENT_FORMAT_H_
