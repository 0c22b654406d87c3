-- ratelimit.lua: one hit on a sliding-window rate limiter, decided and counted in one step.
-- Serves R1 (a hit is admitted only if the estimate stays within the limit, however
-- many callers race: read, decision and increment are this one script) and R2 (a
-- refused hit writes nothing). Time is the Redis server's (TIME), never a caller's.
--
-- Key naming: the window index depends on TIME, which only this script knows, so it
-- cannot be part of a key name without Lua building the name (which keys.py forbids).
-- Instead each limiter is ONE hash whose fixed name keys.py builds, and the window
-- index is stored inside it, next to the two counts the estimate needs:
--   w  index of the current fixed window, floor(server ms / window ms)
--   c  hits admitted in window w
--   p  hits admitted in window w - 1
-- Seen from window w + 1 the counts shift (p = c, c = 0); from later windows both are
-- 0. One key per limiter: no cross-slot concern, one PEXPIRE, nothing to clean up.
--
-- Estimate, e ms into the current window of W ms (the previous window weighted by the
-- share of it the sliding window still covers):
--   p * (W - e) / W + c
-- A hit is admitted iff estimate + 1 <= limit. Everything below is that inequality
-- multiplied by W, in integers (exact while limit * W < 2^53; Rate checks it), so the
-- boundary case estimate + 1 == limit is admitted exactly, with no float rounding.
--
-- KEYS[1]  limiter hash {w, c, p}; PX 2 windows, renewed by every admitted hit (the
--          counts of window w are needed until window w + 1 ends, <= 2 W from now)
-- ARGV[1]  limit, hits per window (integer >= 1)
-- ARGV[2]  window W, ms (integer >= 1)
-- RETURNS  {1, 0, remaining}: admitted and counted; remaining = how many more hits
--          would be admitted if sent at this same instant
--          {0, retry_after_ms, 0}: refused, nothing written; retry_after_ms >= 1 is the
--          exact wait (to the ms, rounded up) until the estimate admits one hit again,
--          assuming no other hit is admitted meanwhile
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local w = math.floor(now / window)
local e = now - w * window

local state = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
local stored = tonumber(state[1])
local cur, prev = 0, 0
-- stored > w only if the server clock stepped back (NTP, a failover): keep counting
-- in the stored window rather than forget its hits, which would over-admit.
local same = stored ~= nil and stored >= w
if same then
  cur, prev = tonumber(state[2]) or 0, tonumber(state[3]) or 0
elseif stored == w - 1 then
  prev = tonumber(state[2]) or 0
end

-- (limit - estimate) * W: admitted iff it leaves room for one more hit, i.e. >= W.
local room = limit * window - prev * (window - e) - cur * window
if room >= window then
  if same then
    redis.call('HINCRBY', KEYS[1], 'c', 1)
  else
    redis.call('HSET', KEYS[1], 'w', w, 'c', 1, 'p', prev)
  end
  redis.call('PEXPIRE', KEYS[1], 2 * window)
  return {1, 0, math.floor((room - window) / window)}
end

local retry
if cur < limit then
  -- Admitted later in this window, as the previous window slides out (prev > 0 here,
  -- or the hit would have been admitted): the first ms e2 with
  -- prev * (W - e2) <= (limit - 1 - cur) * W. e2 <= W, and e2 = W is the next window's
  -- start, where the estimate is cur <= limit - 1.
  retry = window - math.floor((limit - 1 - cur) * window / prev) - e
else
  -- Not in this window (the estimate never falls below cur >= limit). In the next one
  -- p = cur and c = 0: the first ms e2 with cur * (W - e2) <= (limit - 1) * W.
  retry = (window - e) + window - math.floor((limit - 1) * window / cur)
end
if retry < 1 then
  retry = 1
end
return {0, retry, 0}
