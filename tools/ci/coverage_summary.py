"""Per-folder line and branch coverage from a gcovr --json-summary file,
and the floor check of tools/ci/coverage.sh.
Usage: coverage_summary.py coverage.json FLOOR_PERCENT"""
import json
import sys


def pct(covered, total):
    return 100.0 * covered / total if total else 100.0


def main():
    path, floor = sys.argv[1], float(sys.argv[2])
    with open(path) as f:
        files = json.load(f)["files"]
    folders = {}
    for entry in files:
        # src/nn/conv2d.c -> src/nn
        folder = "/".join(entry["filename"].split("/")[:2])
        acc = folders.setdefault(folder, [0, 0, 0, 0])
        acc[0] += entry["line_covered"]
        acc[1] += entry["line_total"]
        acc[2] += entry["branch_covered"]
        acc[3] += entry["branch_total"]
    total = [sum(acc[i] for acc in folders.values()) for i in range(4)]
    print(f"{'folder':<14} {'lines':>15} {'line %':>7} {'branches':>15} {'branch %':>8}")
    for name in sorted(folders) + ["TOTAL"]:
        a = total if name == "TOTAL" else folders[name]
        print(f"{name:<14} {a[0]:>7}/{a[1]:<7} {pct(a[0], a[1]):>6.1f}% "
              f"{a[2]:>7}/{a[3]:<7} {pct(a[2], a[3]):>7.1f}%")
    line = pct(total[0], total[1])
    if line < floor:
        print(f"coverage: FAIL: total line coverage {line:.1f}% is below the floor {floor:g}%")
        return 1
    print(f"coverage: ok: total line coverage {line:.1f}% (floor {floor:g}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
