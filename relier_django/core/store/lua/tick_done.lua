-- tick_done.lua: record a periodic tick as handled (pushed, or skipped by its policy).
-- Serves G11: the entry's last recorded tick only moves forward, so no tick at or
-- before it is claimed again; the caller's own claim (same token) is dropped with it,
-- never another caller's (a claim on a tick is only ever ended by the push of it).
--
-- KEYS[1]  periodic state, hash: entry name -> last tick recorded (epoch ms)
-- KEYS[2]  periodic claims, hash: entry name -> '<tick ms>:<lease deadline ms>:<token>'
-- ARGV[1]  entry name
-- ARGV[2]  tick, epoch ms: pushed by this caller, or the newest tick a policy skipped
-- ARGV[3]  token of the tick.lua call that claimed it ('' or a fresh one for a skip)
-- RETURNS  the entry's last recorded tick after the call (epoch ms)
-- Idempotent as written: a replay sets the same maximum and finds no claim to drop.
local entry, tick = ARGV[1], tonumber(ARGV[2])
local claim = redis.call('HGET', KEYS[2], entry)
if claim and string.match(claim, '^%d+:%d+:(.+)$') == ARGV[3] then
  redis.call('HDEL', KEYS[2], entry)
end
local last = tonumber(redis.call('HGET', KEYS[1], entry) or '-1')
if tick > last then
  redis.call('HSET', KEYS[1], entry, ARGV[2])
  return tick
end
return last
