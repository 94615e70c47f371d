"""The requirements a wheel declares (Requires-Dist lines without extras), one per line, each
with OLD->NEW replacements applied (scripts/vllm_audit.sh: "torch==2.13.0+cpu->torch==2.13.0")."""
import sys
import zipfile

wheel, *replacements = sys.argv[1:]
pairs = [r.split("->", 1) for r in replacements]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist: ") and "extra ==" not in line:
            req = line[len("Requires-Dist: "):]
            for old, new in pairs:
                req = req.replace(old, new)
            print(req)
