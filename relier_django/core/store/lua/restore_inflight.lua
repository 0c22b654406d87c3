-- restore_inflight.lua: put a dead taker's in-flight copies back at the head of their
-- queues (take_inflight.lua kept them), once.
-- Serves G15 (a consumer found dead by its closed connection has its taken messages
-- put back within the same pass that resurrects its tasks) on a Redis broker that is
-- not the store. A copy of a task that ran, or that the pass resurrected, carries an
-- older or a started fence: start.lua refuses it.
--
-- KEYS[1]  the dead taker's in-flight record (transport.inflight_of)
-- ARGV[1]  how long the record of what this call did is kept, ms, for its replay
-- RETURNS  how many messages were put back. A replay of this call after a lost reply
--          (or a second scanner's call for the same death) finds the record's
--          '!restored' mark and answers the same count, putting back nothing.
local done = redis.call('HGET', KEYS[1], '!restored')
if done then
  return tonumber(done)
end
local fields = redis.call('HGETALL', KEYS[1])
local put = 0
-- In the order they were taken, oldest last: each goes to the head (the pop end) of
-- its list, so the oldest is taken first again.
local copies = {}
for i = 1, #fields, 2 do
  local k = tonumber(fields[i])
  if k then
    copies[#copies + 1] = {k, fields[i + 1]}
  end
end
table.sort(copies, function(a, b) return a[1] > b[1] end)
for _, copy in ipairs(copies) do
  local length, rest = string.match(copy[2], '^(%d+):(.*)$')
  local list = string.sub(rest, 1, tonumber(length))
  redis.call('RPUSH', list, string.sub(rest, tonumber(length) + 1))
  put = put + 1
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], '!restored', put)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return put
