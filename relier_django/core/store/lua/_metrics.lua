-- _metrics.lua (included): the cluster-wide counters, histograms and time windows that
-- relier_django's metrics endpoint reads (core/observe/figures.py parses them).
-- A script counts the act it does, in the same step, so a count costs no round trip and
-- is exactly as true as the act: a replay that answers from its own evidence returns
-- before it counts, so nothing is counted twice.
-- A metrics key passed as '' (RELIER["METRICS"] = False) makes every function a no-op.
--
-- <p>:m, the counters hash:
--   <counter>          a monotonic count (pushed, committed, dlq:<reason>, ...)
--   h:<name>:<b>       observations of histogram <name> in bucket b (1-based, not
--                      cumulative; b = #METRIC_BOUNDS_MS + 1 is +Inf)
--   h:<name>:sum       the sum of its observations, ms
-- <p>:m:w, the windows hash: two rings of slots, each slot reset when it is reused.
--   m<k>               the minute index (floor(ms / 60000)) slot k = minute % 120 holds
--   m<k>:<field>       that minute's count (ok, dlq, rec_n, rec_ms, rec_max)
--   h<k>, h<k>:<field> the same per hour, 80 slots (ok, dlq): the 3-day SLO window
-- Every script that includes this file runs its top level on every call, counting or
-- not: tables are built where they are used (a bucket search, a slot's reset), not here
-- (bench/store_cost.py measured the prelude at about 9,000 instructions per call with
-- them here, 3,000 without).
local METRIC_MINUTE_SLOTS, METRIC_HOUR_SLOTS = 120, 80

-- A partitioned store cannot pass '' for a key a call does not need (a Redis Cluster
-- refuses a key outside the script's slot): it passes a name ending in ':-', in the
-- slot, which no script ever writes (keys.KeySpace.absent). Read as ''. Every script
-- with an optional key includes this file before it reads KEYS.
for i = 1, #KEYS do
  local k = KEYS[i]
  if string.byte(k, -1) == 45 and string.byte(k, -2) == 58 then
    KEYS[i] = ''
  end
end

-- Counts pass their increments as text: a number handed to redis.call is printed by
-- the server with a floating-point printf, the costliest part of an HINCRBY here.
local function metric_count(mkey, field, n)
  if mkey ~= '' and redis.call('HINCRBY', mkey, field, n and string.format('%d', n) or '1') == 0 then
    -- A count taken back to nothing (abort.lua) leaves no field: absent reads as 0, and
    -- a push undone in full leaves the store as it found it.
    redis.call('HDEL', mkey, field)
  end
end

local function metric_observe(mkey, name, ms)
  if mkey == '' then
    return
  end
  local METRIC_BOUNDS_MS = {10, 25, 50, 100, 250, 500, 1000, 2000, 5000, 10000, 12500,
    15000, 20000, 30000, 60000, 120000, 300000}
  ms = math.max(0, math.floor(ms))
  local b = #METRIC_BOUNDS_MS + 1
  for i = 1, #METRIC_BOUNDS_MS do
    if ms <= METRIC_BOUNDS_MS[i] then
      b = i
      break
    end
  end
  redis.call('HINCRBY', mkey, string.format('h:%s:%d', name, b), '1')
  redis.call('HINCRBY', mkey, 'h:' .. name .. ':sum', string.format('%d', ms))
end

-- Makes slot (e.g. 'm17') hold index, given the index it holds now (its stamp): a slot
-- reused for a new minute or hour starts from nothing. ring: 'm' (minutes) or 'h'.
local function metric_reset(wkey, ring, slot, index, stamp)
  index = string.format('%d', index)
  if stamp ~= index then
    local fields = ring == 'm' and {'ok', 'dlq', 'rec_n', 'rec_ms', 'rec_max'} or {'ok', 'dlq'}
    local stale = {}
    for i = 1, #fields do
      stale[i] = slot .. ':' .. fields[i]
    end
    redis.call('HDEL', wkey, unpack(stale))
    redis.call('HSET', wkey, slot, index)
  end
end

local function metric_slot(wkey, ring, index, slots)
  local slot = string.format('%s%d', ring, index % slots)
  metric_reset(wkey, ring, slot, index, redis.call('HGET', wkey, slot))
  return slot
end

-- Adds n (default 1) to an outcome ('ok' or 'dlq') in the slots of now_ms's minute and
-- hour: both stamps read in one HMGET.
local function metric_window(wkey, now_ms, field, n)
  if wkey == '' then
    return
  end
  n = n and string.format('%d', n) or '1'
  local minute = math.floor(now_ms / 60000)
  local hour = math.floor(minute / 60)
  local m = string.format('m%d', minute % METRIC_MINUTE_SLOTS)
  local h = string.format('h%d', hour % METRIC_HOUR_SLOTS)
  local stamps = redis.call('HMGET', wkey, m, h)
  metric_reset(wkey, 'm', m, minute, stamps[1])
  metric_reset(wkey, 'h', h, hour, stamps[2])
  redis.call('HINCRBY', wkey, m .. ':' .. field, n)
  redis.call('HINCRBY', wkey, h .. ':' .. field, n)
end

-- One recovery of ms milliseconds in now_ms's minute: its count, sum and maximum.
local function metric_window_recovery(wkey, now_ms, ms)
  if wkey == '' then
    return
  end
  local m = metric_slot(wkey, 'm', math.floor(now_ms / 60000), METRIC_MINUTE_SLOTS)
  redis.call('HINCRBY', wkey, m .. ':rec_n', '1')
  redis.call('HINCRBY', wkey, m .. ':rec_ms', string.format('%d', ms))
  if ms > tonumber(redis.call('HGET', wkey, m .. ':rec_max') or '-1') then
    redis.call('HSET', wkey, m .. ':rec_max', ms)
  end
end
