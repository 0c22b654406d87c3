-- _take.lua: not a script. scripts.py pastes it where a script says '-- @include _take':
-- the pop that take.lua and take_inflight.lua share.
--
-- take_next(n): the next message of the first non-empty of the queue lists KEYS[1..n],
-- asked in that order, and its list's index i; nil when every list is empty. While
-- messages wait behind it, the list's doorbell (KEYS[n+i]) is rung again: one doorbell
-- wakes one waiting worker, and the next one is for another.
local function take_next(n)
  for i = 1, n do
    local message = redis.call('RPOP', KEYS[i])
    if message then
      if redis.call('LLEN', KEYS[i]) > 0 then
        redis.call('ZADD', KEYS[n + i], 0, 'ring')
      end
      return i, message
    end
  end
  return nil, nil
end
