-- leader.lua: acquire or extend the scanner leader lease (compare-and-set).
-- Serves G3 without waste: two scanners never run the same pass at once, and a
-- crashed leader is replaced within one lease TTL.
--
-- KEYS[1]  leader key
-- ARGV[1]  candidate id
-- ARGV[2]  lease TTL, ms
-- RETURNS  1 the candidate holds the lease (acquired or extended); 0 someone else does
local holder = redis.call('GET', KEYS[1])
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
  return 1
end
return 0
