#!/usr/bin/env bash
# Opcode histogram of each decode kernel's SASS (needs cuobjdump; run after a build).
for o in build/temp*/csrc/cuda/decode_fp8.o build/temp*/csrc/cuda/decode_mxfp4.o build/temp*/csrc/cuda/decode_bf16.o; do
  [ -f "$o" ] || continue
  echo "== $o"
  cuobjdump -sass "$o" | awk '/Function :/ {fn=$3} /^ *\/\*[0-9a-f]+\*\// {for(i=2;i<=NF;i++){ if ($i ~ /^[A-Z][A-Z0-9_]*(\.[A-Z0-9_.]+)?$/) {split($i,a,"."); cnt[fn" "a[1]]++; tot[fn]++; break}}} END {for (k in cnt) print cnt[k], k; for (f in tot) print tot[f], f, "TOTAL"}' | sort -k2,2 -k1,1nr | awk '{print}' | grep -E "TOTAL|HMMA|F2FP|PRMT|LDS|STS|LDSM|LOP3|SHF|IMAD|IADD|FMUL|FADD|FFMA|MUFU|SHFL|BAR|LDGSTS|HADD2|HMUL2|HFMA2|BRA|ISETP|SEL|MOV" | head -60
done
