-- tick.lua: claim one periodic tick (entry, tick time) for this caller, or say why not.
-- Serves G11 (a periodic tick fires exactly once however many schedulers run, and a
-- missed tick follows its policy): the entry's last recorded tick only moves forward,
-- and at most one claim per entry exists, so of N concurrent scanners one pushes it.
-- A claim is a lease: a caller that died between this script and its push (or its
-- tick_done.lua) leaves a claim that runs out, and the next caller takes it over and
-- pushes the SAME tick. The push's task id is derived from (entry, tick), so a push
-- the dead caller did make is found by push.lua (the id exists, or its outcome or DLQ
-- entry does) instead of running twice: the task id is the tick's record, the claim
-- only keeps scanners from pushing in parallel (docs/scheduling.md).
--
-- KEYS[1]  periodic state, hash: entry name -> last tick recorded (epoch ms)
-- KEYS[2]  periodic claims, hash: entry name -> '<tick ms>:<lease deadline ms>:<token>'
-- ARGV[1]  entry name (the beat_schedule key)
-- ARGV[2]  tick, epoch ms (a canonical tick time of the entry's schedule)
-- ARGV[3]  token: unique per call, the same in a replay of that call
-- ARGV[4]  lease, ms: how long the claim keeps other callers off (Redis clock)
-- ARGV[5]  '1': seed. The caller saw no state for the entry: if there still is none,
--          record ARGV[2] (the caller's now) as handled, claim nothing and reply
--          {0, ARGV[2]}; an entry's first tick is the first one after it was seen.
-- RETURNS  {1, tick}  claimed: push `tick` (ARGV[2], or an older tick whose claim ran
--                     out: its holder died; push it first), then tick_done.lua
--          {0, last}  nothing to do: the entry's last recorded tick is >= ARGV[2]
--          {2, tick}  another caller holds a live claim on `tick`: try again later
-- A replay (the same token) finds its own claim and answers {1, tick} again.
local entry, tick, token = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local claim = redis.call('HGET', KEYS[2], entry)
local now
if claim then
  local held, deadline, holder = string.match(claim, '^(%d+):(%d+):(.+)$')
  if holder == token then
    return {1, tonumber(held)}
  end
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if tonumber(deadline) > now then
    return {2, tonumber(held)}
  end
  redis.call('HSET', KEYS[2], entry, held .. ':' .. (now + tonumber(ARGV[4])) .. ':' .. token)
  return {1, tonumber(held)}
end
local last = redis.call('HGET', KEYS[1], entry)
if not last then
  if ARGV[5] == '1' then
    redis.call('HSET', KEYS[1], entry, ARGV[2])
    return {0, tick}
  end
elseif tonumber(last) >= tick then
  return {0, tonumber(last)}
end
local t = redis.call('TIME')
now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], entry, ARGV[2] .. ':' .. (now + tonumber(ARGV[4])) .. ':' .. token)
return {1, tick}
