# jq 1.8's definitions where jaq's differ or are missing (most from jq's src/builtin.jq,
# MIT-licensed). Later definitions shadow jaq's of the same name and arity.

def env: $ENV;
def input_filename: null;
def input_line_number: 0;
def get_search_list: [];
def have_decnum: true;
def have_literal_numbers: true;
def halt_error: halt_error(5);

# Numbers
def abs: if type == "number" and . < 0 then - . else . end;
def toboolean:
  if . == "true" then true
  elif . == "false" then false
  elif type == "boolean" then .
  else error("\(type) (\(tojson)) cannot be parsed as a boolean") end;

# Counting generators: jq refuses negative counts.
def limit($n; f):
  if $n < 0 then error("limit doesn't support negative count") else _plumber_limit($n; f) end;
def skip($n; f):
  if $n < 0 then error("skip doesn't support negative count") else _plumber_skip($n; f) end;
def nth($n; f):
  if $n < 0 then error("nth doesn't support negative indices") else first(skip($n; f)) end;
def until(cond; update): def _until: if cond then . else (update | _until) end; _until;

# Paths: jq bounds what is deep.
def getpath($path):
  if $path | length > 10000 then error("Path too deep") else reduce $path[] as $p (.; .[$p]) end;
def setpath($path; $x):
  if $path | length > 10000 then error("Path too deep") else getpath($path) = $x end;
def sort: _plumber_shallow("Comparison too deep") | _plumber_sort;
def group_by(f): _plumber_shallow("Comparison too deep") | _plumber_group_by(f);
def unique: _plumber_shallow("Comparison too deep") | unique_by(.);
def paths(node_filter): . as $dot | paths | select(. as $p | $dot | getpath($p) | node_filter);
def leaf_paths: paths(scalars);
def del(f): delpaths([path(f)]);
def pick(pathexps):
  . as $top | reduce path(pathexps) as $p (null; setpath($p; $top | getpath($p)));
def to_entries: [keys_unsorted[] as $k | {key: $k, value: .[$k]}];
def from_entries:
  reduce .[] as $x ({};
    . + { ($x | if .key == null then .k // .name // .Name // .K // .Key else .key end
              | if type == "string" then . else tojson end):
          ($x | if has("value") then .value elif has("v") then .v else .Value end) });
def with_entries(f): to_entries | map(f) | from_entries;
def walk(f):
  def w: if type == "object" then map_values(w) elif type == "array" then map(w) else . end | f;
  w;
def tostream: path(def r: (.[]? | r), .; r) as $p | getpath($p) | reduce path(.[]?) as $q ([$p, .]; [$p + $q]);
def fromstream(f): { x: null, e: false } as $init
  | foreach f as $i ($init;
      if .e then $init else . end
      | if $i | length == 2
        then setpath(["e"]; $i[0] | length == 0) | setpath(["x"] + $i[0]; $i[1])
        else setpath(["e"]; $i[0] | length == 1) end;
      if .e then .x else empty end);
def truncate_stream(stream):
  . as $n | null | stream | . as $input | if (.[0] | length) > $n then setpath([0]; .[0][$n:]) else empty end;

# Arrays and strings
def join($x): reduce .[] as $i (null;
    (if . == null then "" else . + $x end) +
    ($i | if type == "string" then . elif . == null then ""
          elif type == "boolean" or type == "number" then tojson
          # Else the addition fails, with jq's message.
          else . end)
  ) // "";
def _flatten($x):
  reduce .[] as $i ([]; if $i | type == "array" and $x != 0 then . + ($i | _flatten($x - 1)) else . + [$i] end);
def flatten($x): if $x < 0 then error("flatten depth must not be negative") else _flatten($x) end;
def flatten: _flatten(-1);
def toarray: if type == "array" then . else [.] end;
def trimstr($x): ltrimstr($x) | rtrimstr($x);
def split($sep): _plumber_split($sep);
def ascii: [.] | implode;
# Times: jq's checks and messages, and short broken-down times padded as jq takes them
# (`_plumber_time_in`); jaq converts what passes.
def mktime: _plumber_time_in("mktime") | _plumber_mktime;
def strftime($f): _plumber_time_in("strftime/1"; $f) | _plumber_strftime($f);
def strflocaltime($f): _plumber_time_in("strflocaltime/1"; $f) | _plumber_strflocaltime($f);
def todate: strftime("%Y-%m-%dT%H:%M:%SZ");
def dateadd(u; n): . + n;
def datesub(u; n): . - n;
def date: todate;

# SQL-style
def INDEX(stream; idx_expr): reduce stream as $row ({}; .[$row | idx_expr | tostring] |= $row);
def INDEX(idx_expr): INDEX(.[]; idx_expr);
def JOIN($idx; idx_expr): [.[] | [., $idx[idx_expr]]];
def JOIN($idx; stream; idx_expr): stream | [., $idx[idx_expr]];
def JOIN($idx; stream; idx_expr; join_expr): stream | [., $idx[idx_expr]] | join_expr;
def IN(s): any(s == .; .);
def IN(src; s): any(src == s; .);

# From jaq-json, whose value type this crate replaces.
def transpose: [range([.[] | length] | max) as $i | [.[][$i]]];
def in(xs): . as $x | xs | has($x);
def inside(xs): . as $x | xs | contains($x);
def index($i): indices($i) | .[0];
def rindex($i): indices($i) | .[-1:][0];
def @json: tojson;

# Formats
def @csv: _plumber_csv;
def @tsv: _plumber_tsv;
def @base32: tostring | _plumber_base32;
def @base32d: tostring | _plumber_base32d;
def @html: tostring | escape_html;
