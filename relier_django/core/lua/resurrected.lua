-- resurrected.lua: after the broker accepted a resurrected incarnation, count it and
-- store its envelope for the next replay; the lease deadline becomes a queued grace.
-- Serves G1: until this runs, the lease from resurrect.lua keeps the task covered,
-- so a scanner that dies between the two leaves a task that a later pass redoes.
--
-- KEYS[1]  task hash   KEYS[2]  history list   KEYS[3]  expiry index
-- ARGV[1]  task id
-- ARGV[2]  fence of the dispatched incarnation
-- ARGV[3]  its envelope, canonical JSON
-- ARGV[4]  queued grace, ms (as in push.lua)
-- ARGV[5]  history event: JSON object without its opening brace (see start.lua)
-- RETURNS  1 recorded; 0 the fence moved on meanwhile (nothing written)
local id = ARGV[1]
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[2] then
  return 0
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HINCRBY', KEYS[1], 'res', 1)
redis.call('HSET', KEYS[1], 'env', ARGV[3])
-- The new incarnation may already have started (its heartbeat owns the deadline then).
if redis.call('HGET', KEYS[1], 'state') == 'queued' then
  redis.call('ZADD', KEYS[3], now_ms + tonumber(ARGV[4]), id)
end
redis.call('RPUSH', KEYS[2], '{"at_ms":' .. now_ms .. ',' .. ARGV[5])
return 1
