-- admit.lua: the admission check alone: admit one unit of work against fixed-window
-- counters, or say how long to wait. push.lua does the same inside the push itself;
-- this is for callers that want to check before they start work, and for the benchmark.
-- Serves G6 (overload is refused up front, with Retry-After, rather than queued).
--
-- KEYS[1..n]  admission counters (global, per task, ...)
-- ARGV[2i-1]  limit of counter i (admissions per window)
-- ARGV[2i]    window of counter i, ms
-- RETURNS     {1, 0}         admitted and counted on every counter
--             {0, wait_ms}   refused, nothing counted: retry after wait_ms (>= 1)
-- @include _admission
local wait = admission_wait_ms(1, #KEYS, 1)
if wait > 0 then
  return {0, wait}
end
admission_count(1, #KEYS, 1)
return {1, 0}
